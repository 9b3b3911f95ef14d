set -o pipefail
. /tmp/dsl/env.sh || exit 3
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv
python -m pytest tests/test_gpu_kernels.py -x -q -k "contest_data and 128-256" 2>&1 | tail -30
