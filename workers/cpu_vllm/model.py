"""The tiny model's recipe: a random-weight LLaMA (about 3 M parameters) and a byte-level BPE tokenizer
trained on a generated English and SQL corpus, Llama-3 style special tokens and chat template.

This file runs *by path* in the vLLM venv (``python -I model.py _build-inside --out DIR --spec JSON``, see
``venv.build_model``), where neither this repository nor the dev venv is importable: it imports nothing
but the standard library, and the heavy libraries (torch, tokenizers, transformers) by name at build time.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import random
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["CHAT_TEMPLATE", "MODEL_RECIPE_VERSION", "TinyLlamaSpec", "build_inside", "tokenizer_corpus"]

# Bumped whenever the model recipe below changes, so that a stale build is rebuilt.
MODEL_RECIPE_VERSION = 1


@dataclasses.dataclass(frozen=True)
class TinyLlamaSpec:
    """Shape of the random-weight model. head_dim = hidden_size / num_attention_heads must be one the CPU
    attention backend supports (32, 64, 80, 96, 112, 128, ...); 256 / 4 = 64."""

    vocab_size: int = 3072
    hidden_size: int = 256
    intermediate_size: int = 688
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 4
    max_position_embeddings: int = 16384
    corpus_lines: int = 6000
    seed: int = 0


# The tokenizer's special tokens, Llama-3 style. EOT ends a chat turn and is the tokenizer's eos_token; both
# EOT and EOS stop generation (generation_config.json).
BOS, EOS, EOT, PAD = "<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|pad|>"
HEADER_START, HEADER_END = "<|start_header_id|>", "<|end_header_id|>"
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    " + (message['content'] | trim) + '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)

_TABLES = (  # noqa: SIM905 (a word list reads better as one string)
    "users orders products customers employees departments schools students teachers courses grades races "
    "drivers circuits results seasons accounts loans transactions clients districts cards players teams "
    "matches leagues posts comments votes badges tags molecules atoms bonds books authors reviews stores "
    "sales regions suppliers invoices payments shipments warehouses patients doctors visits"
).split()
_COLUMNS = (  # noqa: SIM905 (a word list reads better as one string)
    "id name title email city country state zip price amount total quantity date year month score rank "
    "rating age salary status type category code label count average budget revenue cost weight height "
    "points wins losses duration distance speed balance gender birthday phone address created updated"
).split()
_NAMES = ("Alice", "Bob", "Carol", "Dave", "Erin", "Frank", "Grace", "Heidi", "Ivan", "Judy", "Mallory", "Olivia")
_PLACES = ("London", "Paris", "Berlin", "Madrid", "Rome", "Tokyo", "Delhi", "Cairo", "Lagos", "Lima", "Toronto")
_WORDS = (  # noqa: SIM905 (a word list reads better as one string)
    "the a an of to in for on with by from at as is are was were be been has have had do does did what "
    "which who how many much list show find give return count average total highest lowest most least each "
    "every all any some more than less between after before during since until per among question answer "
    "database schema table column row value query result error fix check test candidate select join filter "
    "group order limit distinct please write correct following sql statement that number records where data "
    "information report summary compare rank top bottom first last year month day week city country region "
    "good bad large small new old high low long short fast slow early late open closed active inactive "
    "hello thank you sure here let me think step about this because therefore however also only not we they "
    "it these those there their our your my his her its one two three four five ten hundred thousand million "
    "percent money time people place thing way work life world company system able accept across act add "
    "ago agree air allow almost alone along already although always animal another appear apply area argue "
    "arm around arrive art article ask attack attention audience available avoid away baby back ball bank "
    "base beat beautiful become bed begin behavior behind believe benefit best better beyond big bill bit "
    "black blood blue board body born both box boy break bring brother build building business buy call "
    "camera campaign cancer capital car card care career carry case catch cause cell center central century "
    "certain chair challenge chance change character charge child choice choose church citizen civil claim "
    "class clear close coach cold collection college color come commercial common community computer concern "
    "condition conference congress consider consumer contain continue control could couple course court "
    "cover create crime cultural culture cup current customer cut dark daughter dead deal death debate decade "
    "decide decision deep defense degree describe design despite detail determine develop difference "
    "different difficult dinner direction director discover discuss disease doctor dog door down draw dream "
    "drive drop drug economic economy edge education effect effort eight either election else employee end "
    "energy enjoy enough enter entire environment especially establish evening event evidence exactly "
    "example executive exist expect experience expert explain eye face fact factor fail fall family far "
    "father fear federal feel field fight figure fill film final finally financial fine finger finish fire "
    "firm fish floor fly focus follow food foot force foreign forget form former forward free friend front "
    "full fund future game garden general generation girl glass goal government great green ground grow "
    "growth guess gun guy hair half hand hang happen happy hard head health hear heart heat heavy help "
    "herself history hit hold home hope hospital hot hotel hour house huge human husband idea identify image "
    "imagine impact important improve include including increase indeed indicate individual industry inside "
    "instead institution interest international interview investment involve issue item itself job join "
    "just keep key kid kill kind kitchen know knowledge land language later laugh law lawyer lay lead leader "
    "learn leave left leg legal letter level lie light like likely line listen little live local lose loss "
    "lot love machine magazine main maintain major majority make man manage management manager market "
    "marriage material matter maybe mean measure media medical meet meeting member memory mention message "
    "method middle might military mind minute miss mission model modern moment morning mother mouth move "
    "movement movie music must myself nation national natural nature near nearly necessary need network "
    "never news newspaper next nice night none nor north note nothing notice now occur off offer office "
    "officer official often oil once operation opportunity option others outside over own owner page pain "
    "painting paper parent part participant particular partner party pass past patient pattern pay peace "
    "perform performance perhaps period person personal phone physical pick picture piece plan plant play "
    "player point police policy political politics poor popular population position positive possible power "
    "practice prepare present president pressure pretty prevent private probably problem process produce "
    "product production professional professor program project property protect prove provide public pull "
    "purpose push put quality quickly quite race radio raise range rate rather reach read ready real reality "
    "realize reason receive recent recently recognize record red reduce reflect relate relationship "
    "religious remain remember remove represent require research resource respond response responsibility "
    "rest rich right rise risk road rock role room rule run safe same save say scene science scientist "
    "season seat second section security see seek seem sell send senior sense series serious serve service "
    "set seven several shake share shoot shot should shoulder side sign significant similar simple simply "
    "sing single sister sit site situation size skill skin smile social society soldier someone something "
    "sometimes son song soon sort sound source south southern space speak special specific speech spend "
    "sport spring staff stage stand standard star start station stay still stock stop store story strategy "
    "street strong structure student study stuff style subject success successful such suddenly suffer "
    "suggest summer support surface take talk task tax teach teacher team technology television tell tend "
    "term terms theory thought threat through throughout throw thus today together tonight tough toward town "
    "trade traditional training travel treat treatment tree trial trip trouble true truth try turn under "
    "understand unit upon usually various very victim view violence visit voice vote wait walk wall want war "
    "watch water weapon wear weight well west western whatever whether while white whole whom whose why wide "
    "wife will win window wish within without woman wonder word worker worry would wrong yard yeah yes yet "
    "young yourself"
).split()


def _sql_line(rng: random.Random) -> str:
    t1, t2 = rng.sample(_TABLES, 2)
    c1, c2, c3 = rng.sample(_COLUMNS, 3)
    kind = rng.randrange(6)
    if kind == 0:
        return (
            f"SELECT {c1}, {c2} FROM {t1} WHERE {c3} {rng.choice(['=', '>', '<', '>=', '<>'])} {rng.randint(0, 5000)};"
        )
    if kind == 1:
        agg = rng.choice(["COUNT", "SUM", "AVG", "MIN", "MAX"])
        return f"SELECT {agg}({c1}) FROM {t1} GROUP BY {c2} ORDER BY {c2} DESC LIMIT {rng.randint(1, 20)};"
    if kind == 2:
        return (
            f"SELECT T1.{c1}, T2.{c2} FROM {t1} AS T1 INNER JOIN {t2} AS T2 ON T1.{c3}_id = T2.id "
            f"WHERE T2.{c2} = '{rng.choice(_PLACES)}';"
        )
    if kind == 3:
        return f"SELECT DISTINCT {c1} FROM {t1} WHERE {c2} LIKE '%{rng.choice(_NAMES).lower()}%' AND {c3} IS NOT NULL;"
    if kind == 4:
        low, high = rng.randint(1, 100), rng.randint(100, 1000)
        return f"SELECT {c1} FROM {t1} WHERE {c2} IN (SELECT {c2} FROM {t2} WHERE {c3} BETWEEN {low} AND {high});"
    name = rng.choice(_NAMES)
    return f"SELECT CAST(SUM(CASE WHEN {c1} = '{name}' THEN 1 ELSE 0 END) AS REAL) * 100 / COUNT({c2}) FROM {t1};"


def _text_line(rng: random.Random) -> str:
    kind = rng.randrange(5)
    if kind == 0:
        t, c = rng.choice(_TABLES), rng.choice(_COLUMNS)
        return f"How many {t} in {rng.choice(_PLACES)} have a {c} above {rng.randint(1, 999)}?"
    if kind == 1:
        return f"List the {rng.choice(_COLUMNS)} of every {rng.choice(_TABLES)[:-1]} named {rng.choice(_NAMES)}."
    if kind == 2:
        key, col = rng.sample(_COLUMNS, 2)
        return f"CREATE TABLE {rng.choice(_TABLES)} ({key} INTEGER PRIMARY KEY, {col} TEXT);"
    if kind == 3:
        return f"Error: no such column: {rng.choice(_COLUMNS)}_{rng.randint(1, 9)}. Please fix the query."
    return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(6, 18))).capitalize() + "."


def tokenizer_corpus(seed: int, lines: int) -> list[str]:
    """The tokenizer's training text: alternating templated questions or prose and SQL statements."""
    rng = random.Random(seed)
    return [_sql_line(rng) if i % 2 else _text_line(rng) for i in range(lines)]


def build_inside(out: Path, spec: TinyLlamaSpec) -> dict[str, Any]:
    """Runs in the vLLM venv: train the tokenizer, save it and a random-weight LLaMA into ``out``.

    The heavy libraries are imported by name, so that the dev venv (which has none of them) type-checks
    and imports this module.
    """
    torch: Any = importlib.import_module("torch")
    tk: Any = importlib.import_module("tokenizers")
    tf: Any = importlib.import_module("transformers")

    tok = tk.Tokenizer(tk.models.BPE())
    tok.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tk.decoders.ByteLevel()
    trainer = tk.trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        min_frequency=2,
        special_tokens=[BOS, EOS, EOT, PAD, HEADER_START, HEADER_END],
        initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(tokenizer_corpus(spec.seed, spec.corpus_lines), trainer=trainer)
    # Like Llama 3: a plain encode (the /v1/completions path) starts with BOS; the chat template writes its
    # own BOS and vLLM encodes chat prompts without special tokens.
    tok.post_processor = tk.processors.Sequence(
        [
            tk.processors.ByteLevel(trim_offsets=False),
            tk.processors.TemplateProcessing(
                single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, tok.token_to_id(BOS))]
            ),
        ]
    )
    fast = tf.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOS, eos_token=EOT, pad_token=PAD, model_max_length=1 << 16
    )
    fast.chat_template = CHAT_TEMPLATE
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out))
    ids = {name: int(fast.convert_tokens_to_ids(name)) for name in (BOS, EOS, EOT, PAD)}
    config = tf.LlamaConfig(
        vocab_size=len(fast),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=ids[BOS],
        eos_token_id=[ids[EOS], ids[EOT]],
        pad_token_id=ids[PAD],
    )
    torch.manual_seed(spec.seed)
    model = tf.LlamaForCausalLM(config).to(torch.float32)
    model.save_pretrained(str(out))
    # vLLM takes its default sampling parameters from generation_config.json: keep only the stop tokens.
    generation = {"bos_token_id": ids[BOS], "eos_token_id": [ids[EOS], ids[EOT]], "pad_token_id": ids[PAD]}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    params = int(sum(p.numel() for p in model.parameters()))
    return {"vocab_size": len(fast), "parameters": params, "special_ids": ids}


def main(argv: Sequence[str] | None = None) -> int:
    """``_build-inside --out DIR --spec JSON``: build the model into DIR and print a JSON summary."""
    parser = argparse.ArgumentParser(prog="model.py")
    parser.add_argument("command", choices=["_build-inside"])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--spec", required=True)
    args = parser.parse_args(argv)
    spec = TinyLlamaSpec(**json.loads(args.spec))
    print(json.dumps(build_inside(args.out, spec)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
