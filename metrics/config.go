package metrics

import (
	"time"

	"github.com/libnccl-net-go/libnccl-net-go/internal/ncclenv"
	"github.com/libnccl-net-go/libnccl-net-go/nccl"
)

// The metrics settings, read at Start (the glue's init). The metrics are part
// of the glue, so their WARNs read "NET/Go : metrics: ...".
var env = ncclenv.NewGroup("metrics", "NET/Go")

var (
	settingEnabled = env.Bool("NCCL_GO_METRICS", true,
		"0: the glue counts nothing (counters stay 0); only for measuring what counting costs")
	settingPort = env.Int(envPort, -1,
		"serve /metrics on this base port + the local rank").ShowDefault("unset (no endpoint)")
	settingBind = env.String(envBind, defaultBind,
		"listen address of the /metrics endpoint")
	settingTextfileDir = env.String(envTextfileDir, "",
		"write ncclnet_go_rank<R>_pid<P>-<hex>.prom here for node_exporter's textfile collector").ShowDefault("unset (no file)")
	settingInterval = env.Duration(envInterval, defaultInterval, time.Second,
		"how often the textfile is rewritten").Clamp(minInterval, 24*time.Hour)
	// The local rank: ours, then the launchers' (localRankVars).
	settingLocalRank = []*ncclenv.IntVar{
		env.Int(envLocalRank, -1, "this process's rank on its node: port offset, textfile name, local_rank label").ShowDefault("launcher's, else 0"),
		env.Int("LOCAL_RANK", -1, "torchrun's local rank, used when NCCL_GO_METRICS_LOCAL_RANK is unset").ShowDefault("unset"),
		env.Int("OMPI_COMM_WORLD_LOCAL_RANK", -1, "Open MPI's local rank, tried after LOCAL_RANK").ShowDefault("unset"),
		env.Int("SLURM_LOCALID", -1, "Slurm's local rank, tried after OMPI_COMM_WORLD_LOCAL_RANK").ShowDefault("unset"),
		env.Int("MPI_LOCALRANKID", -1, "MPICH / Intel MPI's local rank, tried last").ShowDefault("unset"),
	}
	// The NCCL job: ours, then the batch systems' job ids (jobVars).
	settingJob = []*ncclenv.StringVar{
		env.String(envJob, "", "the nccl_job label on every series: which NCCL job this process belongs to").ShowDefault("launcher's job id, else no label"),
		env.String("SLURM_JOB_ID", "", "Slurm's job id, used when NCCL_GO_METRICS_JOB is unset").ShowDefault("unset"),
		env.String("PBS_JOBID", "", "PBS's job id, tried after SLURM_JOB_ID").ShowDefault("unset"),
		env.String("LSB_JOBID", "", "LSF's job id, tried after PBS_JOBID").ShowDefault("unset"),
		env.String("FLUX_JOB_ID", "", "Flux's job id, tried after LSB_JOBID").ShowDefault("unset"),
		env.String("TORCHELASTIC_RUN_ID", "", "torchrun's --rdzv-id (its default \"none\" is skipped), tried last").ShowDefault("unset"),
	}
)

// Enabled reads NCCL_GO_METRICS: whether the glue counts requests at all.
func Enabled(log nccl.Logger) bool { return settingEnabled.Get(log) }
