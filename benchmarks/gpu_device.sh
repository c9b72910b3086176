#!/usr/bin/env bash
# The GPU table in one call of a lent accelerator machine (JAX and PyTorch with CUDA, timm, no TensorFlow, no
# network). Run from the repository root there, with Keras and what it needs beyond that machine's packages
# carried as wheels in .whl/ (docs/performance.md, "GPU", says how):
#   bash benchmarks/gpu_device.sh            # results under $OUT (or ./gpu-out): env.txt, gpu.json, table.md, ...
#   bash benchmarks/gpu_device.sh --tiny     # other benchmarks/gpu.py options instead of the table's (a CPU check)
# Each worker process has its own timeout, and the JSON is rewritten after each, so a cut run keeps what finished.
# Under 8 minutes on an H100 or H200: the B/16 table (keras-vit with the odd-length attention padded, opt-in
# until measured, and timm; a profile), keras-vit without the padding (the step before it), and the step's ops per block
# in the GPU's optimized HLO, padded and not (benchmarks/hlo_counts.py). GPU_TABLE_MODELS="B/16 L/16" adds L/16.
set -uo pipefail
export KERAS_BACKEND=jax
out=${OUT:-gpu-out}
site=${KERAS_VIT_SITE:-/tmp/site}  # where keras-vit and the wheels are installed for this run
mkdir -p "$out"
steps=(--batch 256 --steps "${GPU_TABLE_STEPS:-10}" --warmup 3 --worker-timeout "${GPU_TABLE_WORKER_TIMEOUT:-170}")
table=(--models ${GPU_TABLE_MODELS:-B/16} "${steps[@]}" --profile B/16 --layer-setting PAD_ODD_ATTENTION=true)
[ $# -gt 0 ] && table=("$@")
# keras-vit itself (its zoo/ and training/ folders install as keras_vit.zoo and keras_vit.training), and the wheels.
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --no-cache-dir --upgrade \
  --target "$site" . $(compgen -G "${KERAS_VIT_WHEELS:-.whl}/*.whl") || exit 1
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
  python3 -c "import jax, torch, timm, keras; print('jax', jax.__version__, jax.devices()); print('torch', torch.__version__, 'cuda', torch.version.cuda, 'timm', timm.__version__, 'keras', keras.__version__)"
  nproc
} 2>&1 | tee "$out/env.txt"
PYTHONUNBUFFERED=1 timeout "${GPU_TABLE_TIMEOUT:-230}" python3 benchmarks/gpu.py "${table[@]}" --out "$out/gpu.json" |
  tee "$out/table.md"
status=${PIPESTATUS[0]}
[ $# -gt 0 ] && exit "$status"  # a check with other options: the table only
PYTHONUNBUFFERED=1 timeout "${GPU_BEFORE_TIMEOUT:-100}" python3 benchmarks/gpu.py --models B/16 "${steps[@]}" \
  --frameworks keras_vit --layer-setting PAD_ODD_ATTENTION=false --out "$out/gpu-unpadded.json" |
  tee "$out/table-unpadded.md"
PYTHONUNBUFFERED=1 timeout "${GPU_HLO_TIMEOUT:-100}" python3 benchmarks/hlo_counts.py --batch 256 \
  --compare PAD_ODD_ATTENTION=false PAD_ODD_ATTENTION=true | tee "$out/hlo-counts.md"
