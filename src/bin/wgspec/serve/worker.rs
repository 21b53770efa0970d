//! The GPU worker: one thread that loads the engine and then serves the jobs of the bounded
//! [`Queue`], streaming token events back to the HTTP handler that queued each job. Jobs the
//! engine batches ([`Engine::batchable`]) join the batch while it has places for them, and
//! every pass serves them all ([`Engine::batch_step`]); any other job (every job under
//! `--max-batch 1`; one naming a draft not loaded fails there) runs alone once the batch is
//! idle, and no later job passes it. When a handler is gone (its client disconnected), its
//! request leaves the batch (its pages free) before the next pass, or a job running alone stops at
//! its next token; a job whose client leaves while it waits leaves the queue at once.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use tokio::sync::{mpsc, oneshot};
use wgspec::engine::{
    BatchEvent, BatchLimits, DraftKind, DraftSpec, Engine, Prompter, Request, SeqId, TokenEvent,
};
use wgspec::generation::FinishReason;
use wgspec::gpu::Gpu;
use wgspec::model::LoadOptions;
use wgspec::openai::Reply;

use super::error::ApiError;
use super::metrics::{GenerationCounts, Metrics};

/// What `wgspec serve` loads.
#[derive(Clone, Debug)]
pub struct ModelConfig {
    /// A .gguf file, a Hugging Face folder or a known model name.
    pub model: String,
    /// What to draft with ([`DraftSpec`]: none, the n-gram, a draft model, Medusa heads or an
    /// EAGLE head, alone or with the n-gram).
    pub draft: DraftSpec,
    /// KV cache positions (default: the engine's, min(model context, 4096)).
    pub context: Option<usize>,
    /// The GPU memory budget of the models, in bytes (`--max-memory-mb`).
    pub max_memory: Option<u64>,
    /// Pages of the target's KV cache pool (`--kv-pages`; default: one context's worth).
    pub kv_pages: Option<usize>,
    /// Requests served together and rows of a pass (`--max-batch`, `--max-batch-tokens`).
    pub batch: BatchLimits,
    /// Whether requests find other requests' pages in the prefix cache (not with
    /// `--no-prefix-sharing`).
    pub share_prefixes: bool,
    /// The token trees of the drafts that grow them (`--tree`).
    pub trees: crate::load::TreeArgs,
}

impl ModelConfig {
    /// The draft a request without a `draft` field speculates with.
    pub fn default_draft(&self) -> DraftKind {
        self.draft.kind()
    }
}

/// What the HTTP side learns once the models are loaded.
pub struct Loaded {
    /// A copy of the target's tokenizer and chat template: handlers tokenize requests (and
    /// check them against the context) before they queue them, and serve `/tokenize` and
    /// `/detokenize`.
    pub prompter: Arc<Prompter>,
    /// KV cache positions: prompt + generated tokens of one request.
    pub context: usize,
}

/// One request waiting in the queue: its prompts (one but for a completions request's list),
/// each fitting the context.
pub struct Job {
    pub parts: Vec<Part>,
    /// Choices asked for per prompt (OpenAI's `n`): choice i of part p is the answer's choice
    /// `p * n + i` and samples with seed `seed + i`, as a request of that prompt alone would.
    pub n: usize,
    pub events: mpsc::UnboundedSender<Event>,
}

/// One prompt of a [`Job`] and its request.
pub struct Part {
    /// Its `max_tokens` is the one [`wgspec::openai::fit_context`] allowed for this prompt.
    pub request: Request,
    /// The prompt, tokenized.
    pub prompt: Vec<u32>,
}

/// What the worker tells the handler of a job, in this order: `Started`, then each choice's
/// `Token`s and `Done` (by its index; those of several choices interleave), or `Failed` (alone,
/// when the request cannot run; after the others, when a choice fails: the request fails).
pub enum Event {
    /// The request fits the context and runs.
    Started,
    Token(usize, TokenEvent),
    Done(usize, Box<Reply>),
    Failed(ApiError),
}

/// The jobs waiting for the GPU worker, oldest first, at most `capacity` of them. A job leaves
/// it when the worker takes it or when its [`Ticket`] is dropped (its client left), so a place
/// held by a client that is gone is free for the next request at once.
pub struct Queue {
    state: Mutex<QueueState>,
    ready: Condvar,
    capacity: usize,
}

struct QueueState {
    /// (ticket number, job), in arrival order.
    jobs: VecDeque<(u64, Job)>,
    next: u64,
    /// The worker has ended (it failed to load, or its thread is gone): nothing will run.
    closed: bool,
}

/// Why [`Queue::push`] refused a job.
pub enum Refused {
    Full,
    Closed,
}

/// A job's place in the [`Queue`]: dropping it takes the job out if it still waits.
pub struct Ticket {
    queue: Arc<Queue>,
    number: u64,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.queue.lock().jobs.retain(|(n, _)| *n != self.number);
    }
}

impl Queue {
    pub fn new(capacity: usize) -> Arc<Queue> {
        let state = QueueState { jobs: VecDeque::new(), next: 0, closed: false };
        Arc::new(Queue { state: Mutex::new(state), ready: Condvar::new(), capacity })
    }

    fn lock(&self) -> MutexGuard<'_, QueueState> {
        // A panic while holding the lock leaves a valid queue.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `job`, or refuses it when `capacity` jobs wait or the worker has ended.
    pub fn push(self: &Arc<Self>, job: Job) -> Result<Ticket, Refused> {
        let mut state = self.lock();
        if state.closed {
            return Err(Refused::Closed);
        }
        if state.jobs.len() >= self.capacity {
            return Err(Refused::Full);
        }
        let number = state.next;
        state.next += 1;
        state.jobs.push_back((number, job));
        self.ready.notify_one();
        Ok(Ticket { queue: self.clone(), number })
    }

    /// The oldest job, waiting for one.
    fn pop(&self) -> Job {
        let mut state = self.lock();
        loop {
            if let Some((_, job)) = state.jobs.pop_front() {
                return job;
            }
            state = self.ready.wait(state).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// The oldest job, if one waits.
    fn try_pop(&self) -> Option<Job> {
        self.lock().jobs.pop_front().map(|(_, job)| job)
    }

    /// Jobs waiting (not counting the one the worker runs).
    pub fn len(&self) -> usize {
        self.lock().jobs.len()
    }

    /// Most jobs that may wait.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn is_closed(&self) -> bool {
        self.lock().closed
    }

    /// Refuses every job from now on and drops the waiting ones (their handlers see the worker
    /// gone).
    fn close(&self) {
        let mut state = self.lock();
        state.closed = true;
        state.jobs.clear();
    }
}

/// Closes the queue when the worker thread ends, however it ends (a panic included).
struct CloseOnExit(Arc<Queue>);

impl Drop for CloseOnExit {
    fn drop(&mut self) {
        self.0.close();
    }
}

/// Loads the target (and the draft model, if any) with progress on stderr, then sizes the KV
/// cache pool of the batch: `--kv-pages`, or what `--max-memory-mb` leaves beside the models.
fn load_engine(cfg: &ModelConfig) -> wgspec::Result<Engine> {
    let gpu = Arc::new(pollster::block_on(Gpu::new())?);
    eprintln!("adapter: {}", gpu.describe());
    let opts = LoadOptions { context: cfg.context, max_memory: cfg.max_memory, ..Default::default() };
    let mut engine = crate::load::load_engine(&gpu, &cfg.model, &cfg.draft, &opts, false)?;
    cfg.trees.apply(&mut engine, &cfg.draft)?;
    engine.set_batch_limits(cfg.batch);
    engine.set_prefix_sharing(cfg.share_prefixes);
    if cfg.kv_pages.is_some() || cfg.max_memory.is_some() {
        engine.set_kv_pool(cfg.kv_pages)?;
    }
    let pages = engine.target().kv_pages();
    eprintln!(
        "KV cache pool: {pages} pages of {} positions ({:.1} MB), batches of up to {} requests",
        wgspec::gpu::KV_PAGE,
        (pages as u64 * engine.target().kv_page_bytes()) as f64 / 1e6,
        cfg.batch.max_seqs
    );
    Ok(engine)
}

/// Starts the worker thread: it loads the models, reports through `loaded` (a panic while
/// loading as its error), then runs the jobs of `queue` for as long as the process lives; should
/// it panic, its requests fail, the queue closes, and `stopped` gets the panic's message (the
/// server then stops, as vLLM's does when its engine dies, so that a supervisor restarts it).
pub fn spawn(
    cfg: ModelConfig,
    queue: Arc<Queue>,
    metrics: Arc<Metrics>,
    loaded: oneshot::Sender<wgspec::Result<Loaded>>,
    stopped: oneshot::Sender<String>,
) -> std::io::Result<()> {
    std::thread::Builder::new().name("wgspec-gpu".into()).spawn(move || {
        let _close = CloseOnExit(queue.clone());
        let engine = match caught(|| load_engine(&cfg)) {
            Ok(Ok(e)) => e,
            Ok(Err(e)) => {
                let _ = loaded.send(Err(e));
                return;
            }
            Err(why) => {
                let _ = loaded
                    .send(Err(wgspec::Error::Gpu(format!("the GPU worker panicked while loading: {why}"))));
                return;
            }
        };
        let context = engine.target_info().context;
        let info = Loaded { prompter: engine.shared_prompter(), context };
        if loaded.send(Ok(info)).is_err() {
            return;
        }
        let mut scheduler =
            Scheduler { engine, batching: cfg.batch.max_seqs > 1, served: HashMap::new(), alone: None };
        if let Err(why) = caught(|| scheduler.run(&queue, &metrics)) {
            // Its requests' handlers answer and no job waits before the engine is touched again:
            // dropping it waits for the GPU to be idle, which a GPU that hung never is, and the
            // process is ending anyway.
            scheduler.served.clear();
            scheduler.alone = None;
            queue.close();
            let _ = stopped.send(why);
            std::mem::forget(scheduler);
        }
    })?;
    Ok(())
}

/// `run`'s value, or the message of its panic (the default hook has printed it with its place
/// already).
fn caught<T>(run: impl FnOnce() -> T) -> Result<T, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)).map_err(|payload| {
        match (payload.downcast_ref::<&str>(), payload.downcast_ref::<String>()) {
            (Some(s), _) => s.to_string(),
            (None, Some(s)) => s.clone(),
            (None, None) => "a panic".to_string(),
        }
    })
}

/// A batched request's handler (a choice of one: `choice`) and what it was sent.
struct Served {
    events: mpsc::UnboundedSender<Event>,
    choice: usize,
    /// The request's prompt tokens while none of its choices is counted: the first counted
    /// (done, or its client gone) takes them, whichever choice it is.
    prompt: Arc<AtomicUsize>,
    tokens: usize,
}

/// The worker's loop: the batch, and a job waiting to run alone.
struct Scheduler {
    engine: Engine,
    /// `--max-batch` above 1.
    batching: bool,
    served: HashMap<SeqId, Served>,
    /// A job the batch does not take, waiting for it to be idle (no later job passes it).
    alone: Option<Job>,
}

impl Scheduler {
    fn run(&mut self, queue: &Queue, metrics: &Metrics) {
        loop {
            self.take_jobs(queue, metrics);
            self.drop_left(metrics);
            if !self.engine.batch_idle() {
                self.pass(metrics);
            } else if let Some(job) = self.alone.take() {
                run_job(&mut self.engine, job, metrics);
            }
            metrics.batch(self.engine.batch_status(), None);
        }
    }

    /// Takes jobs from the queue while the batch has places for them (a burst joins at once;
    /// waiting for one when there is nothing to do): into the batch, or to run alone.
    fn take_jobs(&mut self, queue: &Queue, metrics: &Metrics) {
        let limits = self.engine.batch_limits();
        let places = limits.max_seqs.min(limits.max_rows);
        while self.alone.is_none() {
            let status = self.engine.batch_status();
            let job = if self.engine.batch_idle() {
                queue.pop()
            } else if status.waiting + status.running < places {
                match queue.try_pop() {
                    Some(job) => job,
                    None => return,
                }
            } else {
                return;
            };
            // Its client left between leaving the queue and now.
            if job.events.is_closed() {
                continue;
            }
            if !(self.batching && job.parts.iter().all(|p| self.engine.batchable(&p.request))) {
                self.alone = Some(job);
                return;
            }
            self.submit(job, metrics);
        }
    }

    /// Puts a job's choices into the batch, every prompt's or none.
    fn submit(&mut self, job: Job, metrics: &Metrics) {
        let Job { parts, n, events } = job;
        let mut submitted = Vec::new();
        for (p, Part { request, prompt }) in parts.into_iter().enumerate() {
            let uncounted = Arc::new(AtomicUsize::new(prompt.len()));
            match self.engine.batch_submit_choices(prompt, &request, n) {
                Ok(ids) => {
                    for (i, id) in ids.into_iter().enumerate() {
                        let (events, prompt) = (events.clone(), uncounted.clone());
                        self.served.insert(id, Served { events, choice: p * n + i, prompt, tokens: 0 });
                        submitted.push(id);
                    }
                }
                Err(e) => {
                    self.withdraw(submitted);
                    metrics.failed_generation();
                    let _ = events.send(Event::Failed(e.into()));
                    return;
                }
            }
        }
        if events.send(Event::Started).is_err() {
            self.withdraw(submitted);
        }
    }

    /// Takes sequences of a job out of the batch before any of them ran.
    fn withdraw(&mut self, ids: Vec<SeqId>) {
        for id in ids {
            self.engine.batch_cancel(id);
            self.served.remove(&id);
        }
    }

    /// Takes out of the batch the requests whose clients left (their pages free at once), and
    /// the job waiting to run alone if its client left.
    fn drop_left(&mut self, metrics: &Metrics) {
        if self.alone.as_ref().is_some_and(|job| job.events.is_closed()) {
            self.alone = None;
        }
        let left: Vec<SeqId> =
            (self.served.iter()).filter(|(_, s)| s.events.is_closed()).map(|(&id, _)| id).collect();
        for id in left {
            self.engine.batch_cancel(id);
            if let Some(s) = self.served.remove(&id) {
                metrics.generation(&GenerationCounts {
                    prompt_tokens: s.prompt.swap(0, Ordering::Relaxed),
                    generated_tokens: s.tokens,
                    drafted: 0,
                    accepted: 0,
                    tokens_per_target_forward: 0.0,
                    cancelled: true,
                });
            }
        }
    }

    /// One pass of the batch, its events to their handlers. A failed pass fails every request
    /// it held (the GPU's error: nothing of them can be trusted).
    fn pass(&mut self, metrics: &Metrics) {
        let before = self.engine.batch_status();
        let events = match pollster::block_on(self.engine.batch_step()) {
            Ok(events) => events,
            Err(e) => {
                let what = e.to_string();
                for (id, s) in self.served.drain() {
                    self.engine.batch_cancel(id);
                    metrics.failed_generation();
                    let _ = s.events.send(Event::Failed(wgspec::Error::Gpu(what.clone()).into()));
                }
                return;
            }
        };
        let after = self.engine.batch_status();
        metrics.batch(after, Some((after.rows - before.rows) as usize));
        for (id, ev) in events {
            let Some(s) = self.served.get_mut(&id) else { continue };
            match ev {
                BatchEvent::Token(t) => {
                    s.tokens += t.id.is_some() as usize;
                    let _ = s.events.send(Event::Token(s.choice, t));
                }
                BatchEvent::Done(c) => {
                    let s = self.served.remove(&id);
                    let prompt = s.as_ref().map_or(0, |s| s.prompt.swap(0, Ordering::Relaxed));
                    metrics.generation(&GenerationCounts::of(&c, prompt));
                    if let Some(s) = s {
                        let _ = s.events.send(Event::Done(s.choice, Box::new(Reply::from(*c))));
                    }
                }
                BatchEvent::Failed(e) => {
                    metrics.failed_generation();
                    if let Some(s) = self.served.remove(&id) {
                        let _ = s.events.send(Event::Failed(e.into()));
                    }
                }
            }
        }
    }
}

/// Runs one job alone, its prompts' choices one after another (choice i of a prompt with seed
/// `seed + i`, as the batch seeds them), and counts each generation (a cancelled one too: its
/// tokens were computed).
fn run_job(engine: &mut Engine, job: Job, metrics: &Metrics) {
    let Job { parts, n, events } = job;
    if events.send(Event::Started).is_err() {
        return;
    }
    let choices = parts.iter().enumerate().flat_map(|(p, part)| (0..n).map(move |i| (p * n + i, i, part)));
    for (choice, i, Part { request, prompt }) in choices {
        let req = Request { seed: request.seed.wrapping_add(i as u64), ..request.clone() };
        let result = pollster::block_on(engine.generate_from(prompt.clone(), &req, &mut |ev| {
            events.send(Event::Token(choice, ev.clone())).is_ok()
        }));
        match result {
            Ok(c) => {
                // (a choice that fails ends the job: a prompt counts with its first choice)
                let prompt = if i == 0 { c.prompt_tokens.len() } else { 0 };
                metrics.generation(&GenerationCounts::of(&c, prompt));
                // Only a client that went away cancels: nobody is left to tell.
                if c.finish_reason == FinishReason::Cancelled {
                    return;
                }
                let _ = events.send(Event::Done(choice, Box::new(Reply::from(c))));
            }
            Err(e) => {
                metrics.failed_generation();
                let _ = events.send(Event::Failed(e.into()));
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_is_caught_with_its_message() {
        assert_eq!(caught(|| -> u8 { panic!("the GPU is gone") }), Err("the GPU is gone".to_string()));
        assert_eq!(
            caught(|| -> u8 { std::panic::panic_any(format!("lost {}", 7)) }),
            Err("lost 7".to_string())
        );
        assert_eq!(caught(|| -> u8 { std::panic::panic_any(7u8) }), Err("a panic".to_string()));
        assert_eq!(caught(|| 5), Ok(5), "an end without a panic is its value");
    }
}
