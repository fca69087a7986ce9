#!/bin/bash
# A multi-node job as a cluster's Slurm user guide writes it: one task per node, the first node's
# name as the rendezvous host, and srun starting the program once per task.
# Runs unchanged with `sbatch gang.sh` (gpud's shims: `gpuctl slurm-shims`), which exports this shell's
# environment as Slurm's sbatch does, so the job finds srun and scontrol on its PATH.
#SBATCH --job-name=ddp
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gres=gpu:1
#SBATCH --cpus-per-task=1
#SBATCH --time=00:10:00
#SBATCH --output=ddp_%j.out

head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export HEAD_NODE=$head_node
srun python3 -c 'import os; e = os.environ; print("rank", e["SLURM_PROCID"], "of", e["SLURM_NTASKS"],
    "local", e["SLURM_LOCALID"], "node", e["SLURM_NODEID"], "of", e["SLURM_NNODES"], "on", e["SLURMD_NODENAME"],
    "head", e["HEAD_NODE"])'
