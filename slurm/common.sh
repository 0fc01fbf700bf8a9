# Sourced by the slurm/*.sbatch scripts: the run's environment, its run directory, and pre-emption handling.
# Not a job script itself. Every setting comes from the environment (PODS_*), never from a user path.

pods_setup() {
    # The repository to run in: PODS_ROOT, else where sbatch was called (the scripts are run from a spool copy).
    PODS_ROOT=${PODS_ROOT:-${SLURM_SUBMIT_DIR:-$PWD}}
    cd "$PODS_ROOT" || { echo "[pods] PODS_ROOT=$PODS_ROOT is not a directory" >&2; exit 2; }
    if [ -n "${PODS_SETUP:-}" ]; then eval "$PODS_SETUP"; fi  # e.g. "module load cuda/12.4; conda activate pods"
    export OMP_NUM_THREADS=${OMP_NUM_THREADS:-${SLURM_CPUS_PER_TASK:-1}}
    export TOKENIZERS_PARALLELISM=false
    # One run directory per job (array task), stable across requeues: the job id does not change.
    local id=${SLURM_ARRAY_JOB_ID:+${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}}
    PODS_RUN_DIR=${PODS_RUN_DIR:-runs/slurm/${SLURM_JOB_NAME:-pods}_${id:-${SLURM_JOB_ID:-local}}}
    # PODS_ARGS: overrides placed before the user's. Arrays that can be empty are expanded as
    # ${A[@]+"${A[@]}"}: the plain quoted expansion of an empty array aborts under `set -u` on bash < 4.4.
    PODS_ARGS=()
    # Array jobs without an explicit seed=...: the array index is the seed (sbatch --array=1-10 ...).
    if [ -n "${SLURM_ARRAY_TASK_ID:-}" ]; then PODS_ARGS+=("seed=${SLURM_ARRAY_TASK_ID}"); fi
    # A GPU script on a node without a visible GPU fails, unless CPU was asked for (PODS_ALLOW_CPU=1: a CPU
    # node or the local test cluster, small *_cpu experiments only).
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && [ "$(nvidia-smi -L | grep -c '^GPU')" -gt 0 ]; then
        PODS_GPUS=$(nvidia-smi -L | grep -c '^GPU')
        nvidia-smi -L
    elif [ "${PODS_ALLOW_CPU:-0}" = 1 ]; then
        PODS_GPUS=0
        echo "[pods] no GPU visible and PODS_ALLOW_CPU=1: running on CPU (hardware.device=cpu)."
        PODS_ARGS+=("hardware.device=cpu")
    else
        echo "[pods] no GPU visible on $(hostname) (nvidia-smi missing or lists none; CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-unset})." \
             "This is a GPU script: check the partition/--gpus request and the driver, or set PODS_ALLOW_CPU=1 to run on CPU on purpose." >&2
        exit 2
    fi
    pods_python "$PODS_GPUS"
    echo "[pods] job ${SLURM_JOB_ID:-none} on $(hostname) in $PODS_ROOT, run directory $PODS_RUN_DIR, restart ${SLURM_RESTART_COUNT:-0}"
}

# pods_python GPUS: the interpreter of the job, in PODS_PYTHON. Named: PODS_PYTHON, else GPU_PY. Else, with GPUs, the
# active conda environment's ($CONDA_PREFIX/bin/python: `conda activate pods` before sbatch, which exports it, or in
# PODS_SETUP), never the CPU .venv; and its torch must see CUDA (python -m pods.gpu_env says what it found), else the
# job stops here with that line. Without GPUs (PODS_ALLOW_CPU=1): .venv/bin/python, else python3.
pods_python() {
    local gpus=$1
    PODS_PYTHON=${PODS_PYTHON:-${GPU_PY:-}}
    if [ -z "$PODS_PYTHON" ] && [ "$gpus" -gt 0 ]; then
        if [ -n "${CONDA_PREFIX:-}" ] && [ -x "$CONDA_PREFIX/bin/python" ]; then
            PODS_PYTHON=$CONDA_PREFIX/bin/python
        else
            echo "[pods] no python for GPU work: set GPU_PY=/path/to/env/bin/python or activate environment.yml's env (conda activate pods) before sbatch; the CPU .venv is never used on a GPU node" >&2
            exit 2
        fi
    elif [ -z "$PODS_PYTHON" ]; then
        if [ -x .venv/bin/python ]; then PODS_PYTHON=.venv/bin/python; else PODS_PYTHON=python3; fi
    fi
    if [ "$gpus" -gt 0 ]; then
        "$PODS_PYTHON" -m pods.gpu_env || { echo "[pods] $PODS_PYTHON cannot run GPU work (above); stopping before the run starts" >&2; exit 2; }
    fi
}

# pods_profile_nproc OVERRIDES...: the run's hardware.nproc_per_node (the profile its experiment and overrides name), so
# that a 4-GPU recipe gets 4 ranks on an 8-GPU node; empty when the config cannot be composed here (pods.train then
# refuses a world of the wrong size in one line: hardware.check_world_size).
pods_profile_nproc() {
    "$PODS_PYTHON" -c 'import sys; from pods.compose import compose_plain; print(compose_plain(sys.argv[1:])["hardware"]["nproc_per_node"])' \
        "$@" 2>/dev/null | tail -n 1 | grep -E '^[0-9]+$'
}

# pods_nproc OVERRIDES...: ranks per node, in NPROC: PODS_NPROC, else the profile's hardware.nproc_per_node, else the GPUs
# visible (2 without GPUs). More ranks than GPUs visible: exit 2 with one line.
pods_nproc() {
    local fallback=2 profile
    if [ "$PODS_GPUS" -gt 0 ]; then fallback=$PODS_GPUS; fi
    profile=$(pods_profile_nproc "$@")
    NPROC=${PODS_NPROC:-${profile:-$fallback}}
    echo "[pods] $NPROC rank(s) per node (PODS_NPROC=${PODS_NPROC:-unset}, the profile's hardware.nproc_per_node=${profile:-unknown}, GPUs visible: $PODS_GPUS)"
    if [ "$PODS_GPUS" -gt 0 ] && [ "$NPROC" -gt "$PODS_GPUS" ]; then
        echo "[pods] $NPROC ranks per node but $PODS_GPUS GPU(s) visible: ask for them (sbatch --gpus-per-node=$NPROC) or set PODS_NPROC" >&2
        exit 2
    fi
}

# pods_gloo_ifname HOST: the network interface gloo (vLLM's and DeepSpeed's CPU groups) uses on this node: GLOO_SOCKET_IFNAME,
# else NCCL_SOCKET_IFNAME (a plain list; NCCL's ^exclude and =exact forms are not gloo's), else the interface of this node's
# route to HOST (the rendezvous host; on HOST itself, the interface holding that address, not lo). Without it gloo takes
# the address the hostname resolves to, which may be an interface the other nodes cannot reach: a hang at engine start.
pods_gloo_ifname() {
    local host=$1 addr dev
    if [ -n "${GLOO_SOCKET_IFNAME:-}" ]; then echo "$GLOO_SOCKET_IFNAME"; return; fi
    if [ -n "${NCCL_SOCKET_IFNAME:-}" ] && [ "${NCCL_SOCKET_IFNAME#^}" = "$NCCL_SOCKET_IFNAME" ]; then
        echo "${NCCL_SOCKET_IFNAME#=}"
        return
    fi
    addr=$(getent ahostsv4 "$host" 2>/dev/null | awk 'NR == 1 {print $1}')
    addr=${addr:-$host}
    dev=$(ip route get "$addr" 2>/dev/null | grep -o 'dev [^ ]*' | head -n 1 | cut -d' ' -f2)
    if [ "$dev" = lo ] && [ "${addr#127.}" = "$addr" ]; then
        dev=$(ip -o addr show to "$addr" 2>/dev/null | awk 'NR == 1 {print $2}')
    fi
    echo "$dev"
}

# pods_node_addr NODE: the address SLURM reaches NODE at (its NodeAddr; the node's name where scontrol cannot tell).
pods_node_addr() {
    local addr
    addr=$(scontrol show node "$1" 2>/dev/null | grep -o 'NodeAddr=[^ ]*' | head -n 1 | cut -d= -f2)
    echo "${addr:-$1}"
}

# pods_node_torchrun PYTHON TORCHRUN-ARGS...: one node's part of a multi-node run, run as that node's srun task. torchrun
# gets this node's address (rank 0's node is where every rank finds the process group's store) and, on the job's first
# node (SLURM_NODEID 0, whose address is the rendezvous endpoint), hosts the c10d rendezvous store; the others join it.
pods_node_torchrun() {
    local python=$1 host=0
    shift
    if [ "${SLURM_NODEID:-0}" = 0 ]; then host=1; fi
    if [ -n "${PODS_RDZV_HOST:-}" ]; then
        GLOO_SOCKET_IFNAME=$(pods_gloo_ifname "$PODS_RDZV_HOST")
        if [ -n "$GLOO_SOCKET_IFNAME" ]; then export GLOO_SOCKET_IFNAME; else unset GLOO_SOCKET_IFNAME; fi
        echo "[pods] node ${SLURMD_NODENAME:-$(hostname)}: GLOO_SOCKET_IFNAME=${GLOO_SOCKET_IFNAME:-unset (no route to $PODS_RDZV_HOST found)}"
    fi
    exec "$python" -m torch.distributed.run --local_addr="$(pods_node_addr "${SLURMD_NODENAME:-$(hostname)}")" \
        --rdzv_conf="is_host=$host" "$@"
}

# pods_run FORWARD CMD...: run CMD in the background and wait for it. On SIGUSR1 (sbatch --signal=B:USR1@...:
# the time limit is near) call FORWARD (which passes SIGUSR1 on to the training processes: they checkpoint and
# exit), then requeue this job, which resumes from the checkpoint (the command has train.resume=auto).
# On SIGTERM (pre-emption by the scheduler, scancel) pass it on and wait: the run checkpoints on SIGTERM too.
pods_run() {
    local forward=$1
    shift
    PODS_PREEMPTED=0
    PODS_CHILD=
    trap 'PODS_PREEMPTED=1; echo "[pods] SIGUSR1: time limit near, asking the run to checkpoint"; $forward' USR1
    trap 'echo "[pods] SIGTERM: passing it on"; kill -TERM "$PODS_CHILD" 2>/dev/null' TERM
    "$@" &
    PODS_CHILD=$!
    local rc=0
    while true; do
        wait "$PODS_CHILD"
        rc=$?
        kill -0 "$PODS_CHILD" 2>/dev/null || break  # wait returned because of a trapped signal: keep waiting
    done
    trap - USR1 TERM
    if [ "$PODS_PREEMPTED" = 1 ] && [ "$rc" = 0 ] && [ -n "${SLURM_JOB_ID:-}" ]; then
        # A warning that came as the run was finishing finds no checkpoint left (a finished run removes its periodic
        # ones unless train.checkpoint_at_end=full): requeueing would start it again from scratch.
        if compgen -G "$PODS_RUN_DIR/checkpoints/step_*.pt" >/dev/null; then
            echo "[pods] checkpointed; requeueing job $SLURM_JOB_ID to continue"
            scontrol requeue "$SLURM_JOB_ID"
        else
            echo "[pods] SIGUSR1 came, but the run finished and left no checkpoint to resume from: not requeued"
        fi
    fi
    return "$rc"
}
