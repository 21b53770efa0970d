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
    print(json.dumps({"conversations": CONVERSATIONS, "models": models, "synthetic": synthetic}, indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()
