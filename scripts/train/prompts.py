"""Prompt lists for self-distillation (train) and evaluation (held out).

Prompts are built from instruction templates x subjects. The held-out prompts use subjects (and a few
templates) that never occur in the training prompts, so the evaluation measures generalisation to
unseen requests, not recall of trained ones. Everything is deterministic (seeded shuffles).
"""

import random

# --- coding -------------------------------------------------------------------------------------
CODE_TASKS = [
    "reverses the words in a sentence",
    "checks whether a number is prime",
    "returns the n-th Fibonacci number iteratively",
    "merges two sorted lists into one sorted list",
    "counts how often each word appears in a text",
    "removes duplicate items from a list while keeping their order",
    "converts a temperature from Celsius to Fahrenheit",
    "finds the largest element of an array without using a built-in max",
    "checks whether a string is a palindrome, ignoring case and spaces",
    "computes the factorial of a number recursively",
    "flattens a nested list",
    "returns the greatest common divisor of two integers",
    "parses a comma-separated line into fields",
    "validates a simple email address",
    "implements binary search on a sorted list",
    "sorts a list of dictionaries by a given key",
    "reads a text file and prints its longest line",
    "computes the average of a list of numbers, returning None for an empty list",
    "transposes a matrix given as a list of lists",
    "counts the vowels in a string",
    "converts a Roman numeral to an integer",
    "generates all permutations of a short string",
    "implements a stack with push, pop and peek",
    "implements a queue using two stacks",
    "checks whether brackets in a string are balanced",
    "computes the running sum of a list",
    "finds the two numbers in a list that add up to a target",
    "capitalises the first letter of every word",
    "converts a decimal number to binary",
    "chunks a list into pieces of size n",
    "computes the median of a list",
    "rotates a list to the right by k steps",
    "returns the intersection of two lists",
    "implements bubble sort",
    "implements quicksort",
    "implements a simple LRU cache",
    "computes the dot product of two vectors",
    "checks whether two strings are anagrams",
    "returns the first non-repeating character of a string",
    "computes the sum of the digits of an integer",
]
LANGUAGES = ["Python", "Python", "Python", "JavaScript", "Rust", "C", "Go", "TypeScript", "Java"]
CODE_TEMPLATES = [
    "Write a {lang} function that {task}.",
    "Show me how to write a {lang} function that {task}, with a short explanation.",
    "Implement a function in {lang} that {task}. Add comments.",
    "Can you write {lang} code that {task}?",
]
CODE_MISC = [
    "Explain what a Python list comprehension is, with an example.",
    "What is the difference between a list and a tuple in Python?",
    "Write a SQL query that returns the ten customers with the highest total order value.",
    "Write a SQL query that counts the rows of a table grouped by month.",
    "Write a bash script that renames every .txt file in a folder to .md.",
    "Write a bash one-liner that counts the lines of all Python files in a directory.",
    "Explain what a Rust borrow checker does.",
    "What does the `async` keyword do in JavaScript?",
    "Explain the difference between `==` and `===` in JavaScript.",
    "How do I read a JSON file in Python?",
    "How do I create a virtual environment in Python?",
    "Explain what a hash map is and when to use one.",
    "What is recursion? Give a simple example in Python.",
    "Explain Big O notation with examples.",
    "Write a Python class that represents a bank account with deposit and withdraw methods.",
    "Write a simple HTML page with a heading, a paragraph and a button.",
    "Write CSS that centers a div horizontally and vertically.",
    "Explain what git rebase does and how it differs from git merge.",
    "What is a race condition? How can it be avoided?",
    "Write a Python script that prints the current date and time.",
    "Write a regular expression that matches a US phone number and explain it.",
    "Explain what an API is to a beginner.",
    "What are unit tests and why are they useful?",
    "Write a unit test in Python for a function that adds two numbers.",
    "Explain the difference between a process and a thread.",
    "What is the difference between SQL and NoSQL databases?",
    "Explain what Docker containers are.",
    "Write a JavaScript function that debounces another function.",
    "How does garbage collection work in Java?",
    "Explain what a pointer is in C.",
]

# --- explanations / Q&A -------------------------------------------------------------------------
EXPLAIN_SUBJECTS = [
    "photosynthesis", "the water cycle", "gravity", "black holes", "the immune system",
    "inflation in economics", "supply and demand", "the French Revolution", "plate tectonics",
    "climate change", "how vaccines work", "the theory of evolution", "electricity", "magnetism",
    "the stock market", "compound interest", "machine learning", "neural networks", "the internet",
    "encryption", "blockchain", "DNA", "the solar system", "volcanoes", "earthquakes",
    "the Renaissance", "democracy", "the Roman Empire", "the printing press", "rainbows",
    "the greenhouse effect", "nuclear energy", "solar panels", "the human heart", "sleep",
    "memory in the brain", "antibiotics", "the moon's phases", "ocean tides", "the seasons",
    "how airplanes fly", "how a refrigerator works", "how batteries work", "the Industrial Revolution",
    "the scientific method", "probability", "prime numbers", "the Pythagorean theorem",
    "the speed of light", "atoms", "chemical reactions", "the periodic table", "photosynthesis in algae",
    "bees and pollination", "coral reefs", "rainforests", "deserts", "glaciers", "hurricanes",
    "the Olympic Games",
]
EXPLAIN_TEMPLATES = [
    "Explain {s} in simple terms.",
    "What is {s}? Answer in a short paragraph.",
    "How does {s} work?",
    "Explain {s} to a ten-year-old.",
    "Give me a brief overview of {s}.",
    "What are the most important facts about {s}?",
]
QA = [
    "What is the capital of Australia?",
    "Why is the sky blue?",
    "How many continents are there, and what are they?",
    "What is the boiling point of water at sea level?",
    "Who wrote Romeo and Juliet?",
    "What is the largest planet in our solar system?",
    "How far is the Moon from the Earth?",
    "What is the difference between weather and climate?",
    "Why do leaves change color in autumn?",
    "What causes thunder?",
    "How do fish breathe underwater?",
    "Why do we have leap years?",
    "What is the tallest mountain in the world?",
    "How long does it take light from the Sun to reach Earth?",
    "What is the difference between a virus and a bacterium?",
    "What does a CPU do?",
    "How many bones are in the human body?",
    "What language has the most native speakers?",
    "Why is the ocean salty?",
    "What is the difference between an alligator and a crocodile?",
    "What is 15 percent of 80?",
    "If a train travels 60 miles per hour for 2.5 hours, how far does it go?",
    "What is the square root of 144?",
    "Solve for x: 3x + 7 = 22.",
    "What is the sum of the angles in a triangle?",
    "Convert 5 kilometers to miles.",
    "How many minutes are there in a week?",
    "What is a prime number? List the first ten.",
    "Is zero an even number? Explain.",
    "What is the difference between mean, median and mode?",
]

# --- prose ------------------------------------------------------------------------------------
PROSE_SUBJECTS = [
    "a lighthouse keeper", "a robot learning to paint", "a lost cat finding its way home",
    "the first day of school", "a dragon who is afraid of fire", "a journey across the ocean",
    "a small town in winter", "friendship", "a rainy afternoon", "the last tree on Earth",
    "a time traveler in ancient Egypt", "a chef who loses their sense of taste", "the city at night",
    "a garden in spring", "an old library", "a mountain climber", "a detective solving a mystery",
    "a child's first snowfall", "a spaceship crew", "the sea", "autumn leaves", "a bakery",
    "a musician on the street", "a grandfather's watch", "a forest at dawn",
]
PROSE_TEMPLATES = [
    "Write a short story about {s}.",
    "Write a poem about {s}.",
    "Write a haiku about {s}.",
    "Describe {s} in vivid detail.",
    "Write the opening paragraph of a novel about {s}.",
]
WRITING_TASKS = [
    "Write a polite email to my manager asking for a day off next Friday.",
    "Write a thank-you note to a friend who helped me move.",
    "Write a short product description for a reusable water bottle.",
    "Write a cover letter for a junior software developer position.",
    "Write a short speech for a friend's wedding.",
    "Write a complaint letter about a delayed package.",
    "Write a tweet announcing the launch of a new coffee shop.",
    "Summarize the plot of Cinderella in three sentences.",
    "Rewrite this sentence to sound more formal: 'Hey, can you send me that file real quick?'",
    "Write a short motivational message for someone starting a new job.",
    "Write a recipe for pancakes.",
    "Write a short review of a fictional restaurant.",
    "Write an invitation to a birthday party.",
    "Write a short dialogue between a teacher and a student about homework.",
    "Write a limerick about a cat.",
    "Write an apology message for missing a meeting.",
    "Write a job posting for a barista.",
    "Write a short biography of a fictional inventor.",
    "Write a packing list for a weekend camping trip.",
    "Write a short newsletter introduction for a gardening club.",
]

# --- lists / advice -----------------------------------------------------------------------------
LIST_SUBJECTS = [
    "staying productive while working from home", "learning a new language", "saving money",
    "sleeping better", "studying for exams", "staying healthy", "reducing stress",
    "starting a vegetable garden", "learning to code", "writing a good essay", "public speaking",
    "traveling on a budget", "cooking healthy meals", "keeping a home organized", "running a marathon",
    "making friends in a new city", "preparing for a job interview", "taking better photos",
    "reducing plastic waste", "improving memory", "reading more books", "managing time",
    "caring for a dog", "learning the guitar", "staying safe online",
]
LIST_TEMPLATES = [
    "Give me five tips for {s}.",
    "List ten ideas for {s}.",
    "What are the best ways of {s}?",
    "Make a step-by-step plan for {s}.",
    "What are common mistakes people make when {s}?",
]
COMPARE = [
    ("cats", "dogs"), ("tea", "coffee"), ("trains", "planes"), ("Python", "JavaScript"),
    ("renting", "buying a house"), ("summer", "winter"), ("books", "movies"), ("city life", "country life"),
    ("electric cars", "petrol cars"), ("running", "swimming"), ("TCP", "UDP"), ("RAM", "storage"),
    ("a laptop", "a desktop computer"), ("capitalism", "socialism"), ("weather", "climate"),
]
COMPARE_TEMPLATES = [
    "What is the difference between {a} and {b}?",
    "Compare {a} and {b}: list the pros and cons of each.",
]

# --- held out (subjects never used above) --------------------------------------------------------
HELDOUT = [
    "Write a Python function that returns the most common letter in a string.",
    "Write a JavaScript function that shuffles an array.",
    "Write a Rust function that sums the even numbers of a vector.",
    "Explain what a linked list is and write one in Python.",
    "Write a SQL query that finds duplicate email addresses in a users table.",
    "Explain how a compiler differs from an interpreter.",
    "Explain the Doppler effect in simple terms.",
    "How does the human eye see colors?",
    "What is the Great Wall of China and why was it built?",
    "Explain how bread rises.",
    "What are tectonic hot spots? Answer in a short paragraph.",
    "Why do cats purr?",
    "What is the capital of Canada?",
    "How many hours are there in a leap year?",
    "What is 12 times 17?",
    "Write a short story about a clockmaker who can stop time.",
    "Write a poem about a paper boat.",
    "Write a haiku about a thunderstorm.",
    "Write a polite message declining an invitation to a party.",
    "Write a short product description for noise-cancelling headphones.",
    "Give me five tips for learning to draw.",
    "List ten ideas for a rainy day with kids.",
    "Make a step-by-step plan for building a birdhouse.",
    "What is the difference between a lake and a pond?",
    "Compare bicycles and scooters: list the pros and cons of each.",
    "Explain what a VPN is to a beginner.",
    "Write a bash script that backs up a folder into a dated tar.gz archive.",
    "What is the role of mitochondria in a cell?",
    "Describe a busy market in Marrakesh in vivid detail.",
    "How do submarines dive and surface?",
    "Write a Go function that reverses a slice of integers.",
    "Write a recipe for a simple tomato soup.",
]


def train_prompts(seed: int = 1234) -> list[str]:
    """All training prompts (559), deterministically shuffled."""
    out: list[str] = []
    rng = random.Random(seed)
    for i, task in enumerate(CODE_TASKS):
        for j in range(3):
            lang = LANGUAGES[(i + 3 * j) % len(LANGUAGES)]
            tpl = CODE_TEMPLATES[(i + j) % len(CODE_TEMPLATES)]
            out.append(tpl.format(lang=lang, task=task))
    out += CODE_MISC
    for i, s in enumerate(EXPLAIN_SUBJECTS):
        for j in range(3):
            out.append(EXPLAIN_TEMPLATES[(i + 2 * j) % len(EXPLAIN_TEMPLATES)].format(s=s))
    out += QA
    for i, s in enumerate(PROSE_SUBJECTS):
        for j in range(3):
            out.append(PROSE_TEMPLATES[(i + j) % len(PROSE_TEMPLATES)].format(s=s))
    out += WRITING_TASKS
    for i, s in enumerate(LIST_SUBJECTS):
        for j in range(3):
            out.append(LIST_TEMPLATES[(i + 2 * j) % len(LIST_TEMPLATES)].format(s=s))
    for a, b in COMPARE:
        for t in COMPARE_TEMPLATES:
            out.append(t.format(a=a, b=b))
    out = list(dict.fromkeys(out))  # dedupe, keep order
    held = set(HELDOUT)
    out = [p for p in out if p not in held]
    rng.shuffle(out)
    return out


def heldout_prompts() -> list[str]:
    return list(HELDOUT)


if __name__ == "__main__":
    tr = train_prompts()
    print(len(tr), "train prompts;", len(heldout_prompts()), "held-out prompts")
    for p in tr[:10]:
        print(" ", p)
