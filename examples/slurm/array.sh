#!/bin/bash
# A hyper-parameter sweep as a cluster's Slurm user guide writes it: ten runs, two at a time,
# each with its own seed from $SLURM_ARRAY_TASK_ID. Runs unchanged with `sbatch array.sh`
# (gpud's shims: `gpuctl slurm-shims`) or `gpuctl submit array.sh`.
#SBATCH --job-name=sweep
#SBATCH --partition=gpu
#SBATCH --array=0-9%2
#SBATCH --gres=gpu:1
#SBATCH --cpus-per-task=1
#SBATCH --mem=1G
#SBATCH --time=00:10:00
#SBATCH --output=sweep_%A_%a.out

echo "element $SLURM_ARRAY_TASK_ID of $SLURM_ARRAY_TASK_COUNT (array $SLURM_ARRAY_JOB_ID, job $SLURM_JOB_ID)"
echo "on $SLURM_JOB_NODELIST with $SLURM_GPUS_ON_NODE GPU(s), $SLURM_CPUS_PER_TASK CPU(s), partition $SLURM_JOB_PARTITION"
python3 -c 'import os; print("seed", 1000 + int(os.environ["SLURM_ARRAY_TASK_ID"]))'
