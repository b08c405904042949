package launch

import (
	"os"
	"strconv"
)

// Slurm is what a launch under Slurm (srun, sbatch) takes from its
// environment where the flags say nothing: the job id (slurm-<job id>,
// an array task's slurm-<array job id>_<task id>), the node (the slurmd's
// name for it) and the attempt (the requeue count).
type Slurm struct {
	Job     string
	Node    string
	Attempt int64 // -1: none said
}

// SlurmEnv reads Slurm's variables from env (os.Getenv); ok is false
// outside a Slurm job.
func SlurmEnv(getenv func(string) string) (s Slurm, ok bool) {
	id := getenv("SLURM_JOB_ID")
	if id == "" {
		return Slurm{Attempt: -1}, false
	}
	s.Job = "slurm-" + id
	if arr, task := getenv("SLURM_ARRAY_JOB_ID"), getenv("SLURM_ARRAY_TASK_ID"); arr != "" && task != "" {
		s.Job = "slurm-" + arr + "_" + task
	}
	s.Node = getenv("SLURMD_NODENAME")
	s.Attempt = -1
	if n, err := strconv.ParseInt(getenv("SLURM_RESTART_COUNT"), 10, 64); err == nil && n >= 0 {
		s.Attempt = n
	}
	return s, true
}

// underSlurm reports whether the launch runs inside a Slurm job.
func underSlurm() bool { return os.Getenv("SLURM_JOB_ID") != "" }
