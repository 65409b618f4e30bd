#!/usr/bin/env bash
# Start one real vLLM OpenAI-compatible server on a GPU host, with the flags the HexGen-Flow gateway
# expects. Usage:
#   workers/vllm/launch.sh GPU_CLASS MODEL_PATH [PORT] [-- extra vLLM flags]
#   e.g. workers/vllm/launch.sh A100 /models/Llama-3.1-70B-Instruct 8001
# Environment: MODEL_NAME (served name, default llama-3.1-70b or llama-3.1-8b from the path),
#   MAX_NUM_SEQS (default 64), MAX_MODEL_LEN (default 32768), TP (override the table below),
#   VLLM (the python with vllm installed, default python3).
set -euo pipefail

if [[ $# -lt 2 ]]; then
  sed -n '2,9p' "$0" >&2
  exit 2
fi
gpu=$1
model=$2
port=${3:-8001}
shift $(( $# >= 3 ? 3 : 2 ))
[[ ${1:-} == "--" ]] && shift

size=70b
[[ "$model" == *8B* || "$model" == *8b* ]] && size=8b
name=${MODEL_NAME:-llama-3.1-$size}

# Tensor-parallel degree per GPU class, as in config/gpus.yaml: a 70B model in bf16 needs 4 GPUs of
# 48-80 GB (weights 141 GB plus KV cache) and 8 of the 24 GB L4; an 8B model fits one GPU.
if [[ $size == 70b ]]; then
  case "$gpu" in
    A100|A800|H100|H200|A6000|L40S|L40|A40) tp=4 ;;
    L4) tp=8 ;;
    *) echo "unknown GPU class '$gpu' (known: A100 A800 H100 H200 A6000 L40S L40 A40 L4)" >&2; exit 2 ;;
  esac
else
  tp=1
fi
tp=${TP:-$tp}

exec "${VLLM:-python3}" -m vllm.entrypoints.openai.api_server \
  --model "$model" \
  --served-model-name "$name" \
  --host 0.0.0.0 --port "$port" \
  --tensor-parallel-size "$tp" \
  --gpu-memory-utilization 0.90 \
  --max-model-len "${MAX_MODEL_LEN:-32768}" \
  --max-num-seqs "${MAX_NUM_SEQS:-64}" \
  --max-num-batched-tokens 2048 \
  --enable-chunked-prefill \
  --enable-prefix-caching \
  --scheduling-policy priority \
  "$@"
