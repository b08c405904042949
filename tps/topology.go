package tps

import "fmt"

// Topology is the parallel layout of a job: data (DP), tensor (TP), pipeline
// (PP), context (CP) and expert (EP) parallel sizes.
//
// World size is DP×TP×PP×CP. Expert parallelism does not multiply the world:
// as in Megatron-core, expert-parallel groups are carved out of the data-parallel
// dimension (EP must divide DP), and expert-parallel peers belong to different
// data-parallel replicas, because each one feeds different tokens to the shared
// experts. (The starting design listed EP peers inside a replica; that would
// undercount tokens by EP on every MoE job, so the project follows Megatron.)
//
// Ranks are laid out in Megatron-core's default order "tp-cp-ep-dp-pp", TP
// varying fastest:
//
//	rank = tp + TP·(cp + CP·(dp + DP·pp))
//	ep   = dp mod EP
type Topology struct {
	DP int `json:"dp"`
	TP int `json:"tp"`
	PP int `json:"pp"`
	CP int `json:"cp,omitempty"`
	EP int `json:"ep,omitempty"`
}

// Coords is one rank's position in a Topology.
type Coords struct {
	DP, TP, PP, CP, EP int
}

// DataParallel returns the topology of a job with no model parallelism:
// every rank is its own replica.
func DataParallel(world int) Topology { return Topology{DP: world, TP: 1, PP: 1, CP: 1, EP: 1} }

// normalized treats zero sizes as 1, so callers may leave out the dimensions
// they do not use.
func (t Topology) normalized() Topology {
	for _, p := range []*int{&t.DP, &t.TP, &t.PP, &t.CP, &t.EP} {
		if *p == 0 {
			*p = 1
		}
	}
	return t
}

// WorldSize is DP×TP×PP×CP.
func (t Topology) WorldSize() int {
	t = t.normalized()
	return t.DP * t.TP * t.PP * t.CP
}

// Validate checks that the sizes are positive, that EP divides DP and, when
// world > 0, that they multiply to world.
func (t Topology) Validate(world int) error {
	n := t.normalized()
	for _, d := range []struct {
		name string
		v    int
	}{{"dp", t.DP}, {"tp", t.TP}, {"pp", t.PP}, {"cp", t.CP}, {"ep", t.EP}} {
		if d.v < 0 {
			return fmt.Errorf("%w: topology %s=%d: must be positive", ErrInvalidRecord, d.name, d.v)
		}
		if d.v > MaxWorldSize {
			return fmt.Errorf("%w: topology %s=%d: above %d", ErrInvalidRecord, d.name, d.v, MaxWorldSize)
		}
	}
	if n.DP%n.EP != 0 {
		return fmt.Errorf("%w: topology ep=%d must divide dp=%d (expert parallelism is carved out of data parallelism)", ErrInvalidRecord, n.EP, n.DP)
	}
	if ws := int64(n.DP) * int64(n.TP) * int64(n.PP) * int64(n.CP); world > 0 && ws != int64(world) {
		return fmt.Errorf("%w: topology dp×tp×pp×cp = %d×%d×%d×%d = %d, but world_size = %d", ErrInvalidRecord, n.DP, n.TP, n.PP, n.CP, ws, world)
	}
	return nil
}

// String prints the sizes in the order they are laid out.
func (t Topology) String() string {
	n := t.normalized()
	return fmt.Sprintf("dp=%d tp=%d pp=%d cp=%d ep=%d", n.DP, n.TP, n.PP, n.CP, n.EP)
}

// Coords returns the coordinates of rank. The rank must be in [0, WorldSize).
func (t Topology) Coords(rank int) Coords {
	n := t.normalized()
	c := Coords{}
	c.TP = rank % n.TP
	rank /= n.TP
	c.CP = rank % n.CP
	rank /= n.CP
	c.DP = rank % n.DP
	c.PP = rank / n.DP
	c.EP = c.DP % n.EP
	return c
}

// Rank is the inverse of Coords (EP is implied by DP and ignored).
func (t Topology) Rank(c Coords) int {
	n := t.normalized()
	return c.TP + n.TP*(c.CP+n.CP*(c.DP+n.DP*c.PP))
}

// ReplicaOf returns the data-parallel replica a record belongs to: its
// dp_rank when the rank reports one, otherwise the one derived from its rank.
func (t Topology) ReplicaOf(r *StepRecord) int {
	if r.DPRank != nil {
		return int(*r.DPRank)
	}
	return t.Coords(int(r.Rank)).DP
}

// Fill sets the coordinates a record left out, derived from its rank.
func (t Topology) Fill(r *StepRecord) {
	if r.DPRank != nil && r.TPRank != nil && r.PPRank != nil && r.CPRank != nil && r.EPRank != nil {
		return
	}
	c := t.Coords(int(r.Rank))
	set := func(p **int32, v int) {
		if *p == nil {
			x := int32(v)
			*p = &x
		}
	}
	set(&r.DPRank, c.DP)
	set(&r.TPRank, c.TP)
	set(&r.PPRank, c.PP)
	set(&r.CPRank, c.CP)
	set(&r.EPRank, c.EP)
}
