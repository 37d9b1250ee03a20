"""Chat templates: tk chat --render against transformers' apply_chat_template.

    chat_oracle.py check TK BASE TOKENIZER_JSON

writes one directory per template under BASE (tokenizer.json linked, tokenizer_config.json with the
template and bos/eos tokens), renders every conversation with add_generation_prompt both ways through
transformers (PreTrainedTokenizerFast.from_pretrained(dir).apply_chat_template(..., tokenize=False)) and
through `TK chat DIR --render --message ROLE=TEXT ...`, and prints each difference. When transformers
raises (raise_exception, a role the template refuses), tk must fail with the same message. Exit 1 on
any difference. The templates are the public ones of each model family (tokenizer_config.json on the
Hub), written out here.
"""
import json
import os
import subprocess
import sys

TEMPLATES = {
    "llama3": "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}",
    "llama31": """{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- set date_string = "26 Jul 2024" %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message + builtin tools #}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{%- if builtin_tools is defined or tools is not none %}
    {{- "Environment: ipython\\n" }}
{%- endif %}
{%- if builtin_tools is defined %}
    {{- "Tools: " + builtin_tools | reject('equalto', 'code_interpreter') | join(", ") + "\\n\\n"}}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\\n\\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}
        {{- '{"name": "' + tool_call.name + '", ' }}
        {{- '"parameters": ' }}
        {{- tool_call.arguments | tojson }}
        {{- "}" }}
        {{- "<|eot_id|>" }}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
""",
    "chatml_qwen2": "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}",
    "mistral": "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}",
    "llama2": "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}",
    "zephyr": "{% for message in messages %}\n{% if message['role'] == 'user' %}\n{{ '<|user|>\n' + message['content'] + eos_token }}\n{% elif message['role'] == 'system' %}\n{{ '<|system|>\n' + message['content'] + eos_token }}\n{% elif message['role'] == 'assistant' %}\n{{ '<|assistant|>\n'  + message['content'] + eos_token }}\n{% endif %}\n{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n{% endfor %}",
    "gemma": "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}",
    "phi3": "{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'assistant' %}{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}",
    # the rest of the subset: namespace, loop attributes, filters, tests, methods, slices, literals,
    # lstrip_blocks/trim_blocks without '-', comments, a loop filter, unpacking, break/continue
    "features": """{% set ns = namespace(count=0, last_user='') %}
{% for m in messages %}
  {% if m.role == 'user' %}
    {% set ns.count = ns.count + 1 %}
    {% set ns.last_user = m.content %}
  {% endif %}
  [{{ loop.index }}/{{ loop.length }}{{ '*' if loop.last else '' }}{{ '^' if loop.first }}] {{ m.role | upper }}: {{ m.content | tojson }} {{ loop.revindex0 }}
{% endfor %}
{# a comment
   over lines #}
users={{ ns.count }} last={{ ns.last_user | length }} {{ messages[-1]['role'] ~ '!' }} {{ messages[::-1][0].role }}
{{ (messages | length) > 2 and not add_generation_prompt }} {{ nothing is defined }} {{ none is none }} {{ [1, 2, 3][1:] }}
{{ {'a': 1}.get('a') }} {{ 'a,b'.split(',') | join('+') }} {{ 7 // 2 }} {{ -7 % 3 }} {{ "xy".startswith("x") }} {{ ' pad '.strip() ~ '|' }}
{% for k, v in {'p': 1, 'q': [True, None, "s"]}.items() %}{{ k }}={{ v | tojson }};{% endfor %}
{% for m in messages if m.role != 'system' %}{{ loop.index0 }}{{ m.role[0] }}{% endfor %}
{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i > 4 %}{% break %}{% endif %}{{ i }}{% endfor %}
{{ nothing | default('dflt') }} {{ '' | default('empty', true) }} {{ messages[0].content | lower | title }} {{ "A" in "BAC" }} {{ 'q' not in ['a'] }}
{%- if add_generation_prompt %}
    {{- '\\n<gen>' -}}
{% endif %}
tail {{ 3 - 1 }}{{ "é" | length }}
""",
}

CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi there"},
     {"role": "assistant", "content": "  Hello! How can I help?  "},
     {"role": "user", "content": "What's 2+2?\nAnswer with \"one\" word: caf\u00e9 \u65e5\u672c \U0001F600\t"}],
    [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}],
    [{"role": "user", "content": "a"}, {"role": "user", "content": "twice"}],
]


def main():
    from transformers import PreTrainedTokenizerFast
    tk, base, tokjson = sys.argv[2], sys.argv[3], sys.argv[4]
    bad = n = 0
    for name, tmpl in TEMPLATES.items():
        d = os.path.join(base, name)
        os.makedirs(d, exist_ok=True)
        if not os.path.exists(os.path.join(d, "tokenizer.json")):
            os.symlink(os.path.abspath(tokjson), os.path.join(d, "tokenizer.json"))
        with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
            json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>",
                       "eos_token": {"__type": "AddedToken", "content": "</s>", "lstrip": False, "normalized": False, "rstrip": False,
                                     "single_word": False, "special": True},
                       "chat_template": tmpl if name != "chatml_qwen2" else
                       [{"name": "tool_use", "template": "{{ raise_exception('not this one') }}"},
                        {"name": "default", "template": tmpl}]}, f)
        tok = PreTrainedTokenizerFast.from_pretrained(d)
        for conv in CONVERSATIONS:
            for agp in (False, True):
                n += 1
                try:
                    want, err = tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=agp), None
                except Exception as e:  # the template's raise_exception
                    want, err = None, str(e)
                args = [tk, "chat", d, "--render"] + ["--message=" + "x"] * 0
                for m in conv:
                    args += ["--message", m["role"] + "=" + m["content"]]
                if not agp:
                    args.append("--no-generation-prompt")
                p = subprocess.run(args, capture_output=True)
                got, gerr = p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")
                if err is None and (p.returncode != 0 or got != want):
                    bad += 1
                    print(f"{name} agp={agp} {conv!r}:\n  transformers {want!r}\n  tk (rc {p.returncode}) {got!r} {gerr!r}")
                elif err is not None and (p.returncode != 2 or err not in gerr):
                    bad += 1
                    print(f"{name} agp={agp} {conv!r}: transformers raised {err!r}; tk rc {p.returncode} {got!r} {gerr!r}")
    print(f"{n} renderings compared, {bad} differ")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "check":
        main()
    else:
        sys.exit(__doc__)
