package cli

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/tpsprof/tpsprof/agent"
	"github.com/tpsprof/tpsprof/client"
	"github.com/tpsprof/tpsprof/launch"
	"github.com/tpsprof/tpsprof/mfu"
	"github.com/tpsprof/tpsprof/natsconn"
	"github.com/tpsprof/tpsprof/tps"
)

func runLaunch(args []string, stdout, stderr io.Writer) int {
	const cmd = "launch"
	fs := newFlagSet(cmd, "launch --job ID [flags] -- COMMAND [ARGS...]", `  # torchrun under tpsprof: ranks find the agent through TPSPROF_SOCKET
  tpsprof launch --job llama-8b --nats nats://collector:4222 --dp 4 --tp 8 --pp 2 --model llama3-8b --gpu h100-sxm \
      -- torchrun --nproc-per-node 8 train.py

  # an unmodified PyTorch script, measured (data wait, forward, backward, optimizer, communication)
  tpsprof launch --auto --job llama-8b --nats nats://collector:4222 -- torchrun --nproc-per-node 8 train.py

It starts an agent in process when none serves the socket, exports TPSPROF_SOCKET, TPSPROF_JOB,
TPSPROF_ATTEMPT, TPSPROF_TOPOLOGY and TPSPROF_NODE, puts the tpsprof Python package on
PYTHONPATH (import tpsprof works with nothing installed), forwards SIGINT and SIGTERM, records
attempt_start and attempt_end events and exits with the command's exit code.

Under Slurm (srun, sbatch) the job id, node and attempt default to Slurm's (see the flags);
tasks on one node share one agent (a launch that loses the race to serve the socket uses the
winner's); a SIGTERM from Slurm (a requeue, a preemption) is named as such, not as a crash.

Attempts: without --attempt, launch asks the collector. Nodes of one launch join the attempt
the first of them started; a new launch under a job id that has data becomes the next attempt,
so it is reported apart and never dropped as duplicates. torchrun's elastic restarts add their
restart count to the attempt inside the ranks.
`+natsEnvHelp, stderr)
	var no natsconn.Options
	natsFlags(fs, &no)
	slurm, inSlurm := launch.SlurmEnv(os.Getenv)
	job := fs.String("job", cmp.Or(os.Getenv(launch.EnvJob), slurm.Job), "job id, 1-64 characters of [A-Za-z0-9_-] (default $TPSPROF_JOB; under Slurm slurm-$SLURM_JOB_ID, an array task's slurm-$SLURM_ARRAY_JOB_ID_$SLURM_ARRAY_TASK_ID)")
	attempt := fs.Int64("attempt", -1, "attempt of this launch (default: under Slurm $SLURM_RESTART_COUNT, else asked of the collector, see below)")
	node := fs.String("node", "", "this node's name in records and events when the launch starts its own agent, and in TPSPROF_NODE (default: $SLURMD_NODENAME under Slurm, else the host name; a launch that joins a serving agent is stamped with that agent's --node)")
	auto := fs.Bool("auto", false, "zero-code capture: instrument the Python training script without changing it")
	flopsEvery := fs.Int64("flops-every", -1, "steps between FLOP counts by PyTorch's FlopCounterMode (torch >= 2.1): the third step is counted, then every N; the counted steps are left out of the figures; 0 for none (default: the package's, 1000)")
	tokensPerStep := fs.Int64("tokens-per-step", 0, "tokens each rank trains a step (micro-batches × sequence length, over gradient accumulation), for loops whose tokens no DataLoader or model input shows; the job's own tokens= or add_tokens win")
	tensorboard := fs.String("tensorboard", "", "also write each rank's per-step figures as TensorBoard event files into DIR/rank<N> (the job's own W&B, TensorBoard and MLflow runs get them anyway: docs/trackers.md)")
	noTrackers := fs.Bool("no-trackers", false, "keep tpsprof's figures out of the job's W&B, TensorBoard and MLflow runs")
	pyDir := fs.String("python-dir", "", "where the Python package is unpacked for PYTHONPATH (default: the user cache dir; - for none)")
	socket := fs.String("socket", client.DefaultSocket(), "intake socket of the node's agent")
	var topo tps.Topology
	fs.IntVar(&topo.DP, "dp", 0, "data-parallel size")
	fs.IntVar(&topo.TP, "tp", 0, "tensor-parallel size")
	fs.IntVar(&topo.PP, "pp", 0, "pipeline-parallel size")
	fs.IntVar(&topo.CP, "cp", 0, "context-parallel size")
	fs.IntVar(&topo.EP, "ep", 0, "expert-parallel size (carved out of dp)")
	micro := fs.Int("micro-batches", 0, "micro-batches per step (for the theoretical pipeline bubble)")
	model := fs.String("model", "", "model preset, for MFU")
	hfConfig := fs.String("hf-config", "", "Hugging Face config.json of the model, for MFU (instead of --model)")
	seq := fs.Int("seq", 0, "training sequence length (the attention term of MFU; default: the preset's)")
	attention := fs.String("attention", "", "causal-attention FLOPs convention: full (default) or causal")
	gpu := fs.String("gpu", "", "GPU name or table key, for MFU (default: what NVML reports)")
	dtype := fs.String("dtype", "", "training dtype (default bf16)")
	price := fs.Float64("gpu-hour-usd", 0, "price of a GPU-hour, for cost per million tokens")
	dash := len(args)
	for i, a := range args {
		if a == "--" {
			dash = i
			break
		}
	}
	if code, ok := parseFlags(fs, args[:dash], stderr); !ok {
		return code
	}
	natsClientSecrets(&no)
	if dash >= len(args)-1 {
		return usageErr(stderr, cmd, "no command: put it after --")
	}
	lf := launchFlags{job: *job, topo: topo, micro: *micro, model: *model, hfConfig: *hfConfig, seq: *seq, attention: *attention,
		gpu: *gpu, dtype: *dtype, price: *price, flopsEvery: *flopsEvery, tokensPerStep: *tokensPerStep, attempt: *attempt}
	flops, meta, err := lf.check()
	if err != nil {
		return usageErr(stderr, cmd, "%s", err)
	}
	log := newLogger(stderr, false)
	if *attempt < 0 && inSlurm && slurm.Attempt >= 0 {
		*attempt = slurm.Attempt // a requeue is the next attempt; every task of the job agrees
	}
	acfg := agent.Config{Socket: *socket, NATS: no, Logger: log, Node: *node}
	if r, err := agent.OpenNVML(); err == nil {
		acfg.GPU = r // used only if launch starts its own agent
	} else {
		log.Debug("GPU telemetry off", "why", err)
	}
	code, err := launch.Run(context.Background(), launch.Config{Job: *job, Attempt: max(*attempt, 0),
		ChooseAttempt: *attempt < 0, Auto: *auto, TokensPerStep: *tokensPerStep, FlopsEvery: flops, PythonDir: *pyDir, Meta: meta,
		TensorBoard: *tensorboard, NoTrackers: *noTrackers,
		Agent: acfg, Command: args[dash+1:], Stdout: stdout, Stderr: stderr})
	if acfg.GPU != nil {
		acfg.GPU.Close() // the agent Launch started has closed it already; Close is idempotent
	}
	if err != nil {
		failErr(stderr, "launch", err)
	}
	return code
}

// launchFlags are launch's flags that describe the job.
type launchFlags struct {
	job, model, hfConfig, attention, gpu, dtype string
	topo                                        tps.Topology
	micro, seq                                  int
	price                                       float64
	flopsEvery, tokensPerStep, attempt          int64
}

// check checks the flags and makes the run metadata (and --flops-every:
// nil for the package's default).
func (f launchFlags) check() (*int64, tps.RunMeta, error) {
	var meta tps.RunMeta
	if !tps.ValidJobID(f.job) {
		return nil, meta, fmt.Errorf("--job %q: give 1-64 characters of [A-Za-z0-9_-]", f.job)
	}
	if f.topo != (tps.Topology{}) {
		if err := f.topo.Validate(0); err != nil {
			return nil, meta, err
		}
	}
	if f.model != "" && f.hfConfig != "" {
		return nil, meta, errors.New("--model and --hf-config both given: choose one")
	}
	if f.seq < 0 {
		return nil, meta, fmt.Errorf("--seq %d must not be negative", f.seq)
	}
	var flops *int64
	if f.flopsEvery >= 0 {
		flops = &f.flopsEvery
	} else if f.flopsEvery != -1 {
		return nil, meta, fmt.Errorf("--flops-every %d: give 0 (never) or the steps between counts", f.flopsEvery)
	}
	if f.tokensPerStep < 0 || f.tokensPerStep > tps.MaxTokens {
		return nil, meta, fmt.Errorf("--tokens-per-step %d: give the tokens one rank trains a step, 1 to %d", f.tokensPerStep, tps.MaxTokens)
	}
	if f.attention != "" && f.attention != "full" && f.attention != "causal" {
		return nil, meta, fmt.Errorf("--attention %q: want full or causal", f.attention)
	}
	meta, err := f.meta()
	if err != nil {
		return nil, meta, err
	}
	if f.attempt < -1 {
		return nil, meta, fmt.Errorf("--attempt %d: give 0 or more", f.attempt)
	}
	return flops, meta, nil
}

// meta is the run metadata the flags give, its model checked.
func (f launchFlags) meta() (tps.RunMeta, error) {
	meta := tps.RunMeta{Topology: f.topo, MicroBatches: f.micro, ModelPreset: f.model, Seq: f.seq, Attention: f.attention, GPU: f.gpu, DType: f.dtype, GPUHourUSD: f.price}
	if f.hfConfig != "" {
		b, err := os.ReadFile(f.hfConfig)
		if err != nil {
			return meta, fmt.Errorf("--hf-config: %v", err)
		}
		m, err := mfu.FromHFConfig(b)
		if err != nil {
			return meta, fmt.Errorf("--hf-config %s: %v", f.hfConfig, err)
		}
		if f.seq == 0 {
			return meta, errors.New("--hf-config needs --seq: config.json gives the model's context limit, not the length it is trained at")
		}
		meta.Model = &m
	}
	if meta.Model != nil || meta.ModelPreset != "" {
		model, _, err := meta.ResolvedModel()
		if err == nil {
			_, err = model.Count(mfu.Attention(meta.Attention), mfu.RecomputeNone)
		}
		if err != nil {
			return meta, err
		}
	}
	return meta, nil
}
