#!/bin/bash
# Every kernel measurement of benchmarks/ in one sitting on a CUDA GPU with PyTorch
# (about 3-5 minutes on a Hopper GPU), each step's files kept even if a later one fails:
#
#     bash benchmarks/measure_all.sh h200-sxm-141gb results/
#
# GPU is the stepsim GPU preset the card is (`stepsim list` names them); stepsim must import.
# Writes into DIR: machine.txt (nvidia-smi, PyTorch, CUDA, cuDNN), timing-modes.txt,
# GPU-bf16.toml, GPU-bf16-queued.toml, GPU-moe.csv, GPU-attention.csv, GPU-fp8.toml,
# GPU-fp8-queued.toml, GPU-fp8-fast-accum.toml (docs/calibration.md says what each is for).
set -u
gpu=${1:?usage: measure_all.sh GPU DIR}
dir=${2:?usage: measure_all.sh GPU DIR}
here=$(dirname "$0")
mkdir -p "$dir"
date -u
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,power.limit,memory.total \
    --format=csv | tee "$dir/machine.txt"
python3 -c "import torch; p = torch.cuda.get_device_properties(0); print('torch', torch.__version__, \
'CUDA', torch.version.cuda, 'cuDNN', torch.backends.cudnn.version(), p.name, p.multi_processor_count, 'SMs')" \
    | tee -a "$dir/machine.txt"
step() {
    local limit=$1 start=$SECONDS
    shift
    timeout "$limit" "$@"
    echo "== exit $? after $((SECONDS - start)) s: $*"
}
step 90 python3 "$here/gemm_timing_modes.py" | tee "$dir/timing-modes.txt"
step 90 python3 "$here/measure_kernels.py" --gpu "$gpu" --out "$dir/$gpu-bf16.toml"
step 90 python3 "$here/measure_kernels.py" --gpu "$gpu" --queue-ahead --out "$dir/$gpu-bf16-queued.toml"
step 200 python3 "$here/measure_moe_kernels.py" --gpu "$gpu" --out "$dir/$gpu-moe.csv"
step 90 python3 "$here/measure_attention.py" --gpu "$gpu" --out "$dir/$gpu-attention.csv"
step 60 python3 "$here/measure_kernels.py" --gpu "$gpu" --precision fp8 --out "$dir/$gpu-fp8.toml"
step 60 python3 "$here/measure_kernels.py" --gpu "$gpu" --precision fp8 --queue-ahead \
    --out "$dir/$gpu-fp8-queued.toml"
step 60 python3 "$here/measure_kernels.py" --gpu "$gpu" --precision fp8 --fast-accum \
    --out "$dir/$gpu-fp8-fast-accum.toml"
date -u
