package agent

import (
	"net"
	"sync"
	"time"
)

// Jobs belong to users. An agent run as a node service shares one intake
// socket between users (--socket-mode 0660 or 0666): without more, any
// user who can write to it could write steps, events or metadata into
// another user's job. So the agent reads each connection's peer user
// (SO_PEERCRED) and gives a job to the first user whose connection writes
// a valid step record for it (a line that fails validation, or a line of
// another kind, claims nothing); lines for that job from another user's
// connection are refused (job:owner). Root is trusted (it could do
// anything anyway); a connection whose user cannot be read (not Linux) is
// not checked. A job no open connection carries is free again after
// ownerGrace. A user holds at most maxOwnersPerUID jobs (job:owner_limit),
// so no user can fill the table for the others.

// maxOwners bounds the jobs whose owner is remembered; maxOwnersPerUID
// the jobs one user holds.
const (
	maxOwners       = 1 << 16
	maxOwnersPerUID = 4096
)

// ownerGrace is how long a job stays its user's once no connection
// carries it (ForgetAfter when shorter): long enough for its ranks to
// reconnect after a restart.
const ownerGrace = time.Minute

// ownership is which user's ranks write which job on a shared socket.
type ownership struct {
	ownMu   sync.Mutex
	owners  map[string]*jobOwner // job → the user whose ranks write it
	ownedBy map[int64]int        // uid → jobs it holds in owners
}

type jobOwner struct {
	uid  int64
	seen int64 // unix ns: last found carried by a connection
}

// ownerAllows says whether the connection may write a line for job: no
// other user holds it. It claims nothing (ownerClaim does, for a valid
// step record). Serve goroutine only: the connection's last job is
// cached, so a line of the job it already holds costs a comparison.
func (a *Agent) ownerAllows(info *connInfo, job string) bool {
	if info == nil || info.uid <= 0 {
		return true // in process, root, or a user not known
	}
	if p := info.owned.Load(); p != nil && *p == job {
		return true
	}
	a.ownMu.Lock()
	o, held := a.owners[job]
	a.ownMu.Unlock()
	if held && o.uid != info.uid {
		a.refuseOwner(job, info.uid, o.uid)
		return false
	}
	return true
}

// ownerClaim takes job for the connection's user, for a step record that
// passed validation: refused when another user holds it, or when the
// table (or this user's share of it) is full.
func (a *Agent) ownerClaim(info *connInfo, job string) bool {
	if info == nil || info.uid <= 0 {
		return true
	}
	if p := info.owned.Load(); p != nil && *p == job {
		return true
	}
	now := time.Now().UnixNano()
	a.ownMu.Lock()
	o, held := a.owners[job]
	switch {
	case held && o.uid != info.uid:
		a.ownMu.Unlock()
		a.refuseOwner(job, info.uid, o.uid)
		return false
	case !held && (len(a.owners) >= maxOwners || a.ownedBy[info.uid] >= maxOwnersPerUID):
		n := a.ownedBy[info.uid]
		a.ownMu.Unlock()
		a.reject("job:owner_limit")
		a.log.Warn("job:owner_limit", "too many jobs on this agent (or of this user) to remember their users; record refused", "job", job, "uid", info.uid, "user_jobs", n, "jobs", maxOwners)
		return false
	case !held:
		a.owners[job] = &jobOwner{uid: info.uid, seen: now}
		a.ownedBy[info.uid]++
	default:
		o.seen = now
	}
	a.ownMu.Unlock()
	info.owned.Store(&job)
	return true
}

func (a *Agent) refuseOwner(job string, uid, owner int64) {
	a.reject("job:owner")
	a.log.Warn("job:owner", "a line for a job another user's ranks write was refused", "job", job, "uid", uid, "owner_uid", owner)
}

// forgetOwners frees the jobs no connection has carried for ownerGrace
// (the trace worker's tick).
func (a *Agent) forgetOwners() {
	a.ownMu.Lock()
	n := len(a.owners)
	a.ownMu.Unlock()
	if n == 0 {
		return
	}
	carried := a.carriedJobs()
	now := time.Now().UnixNano()
	old := now - min(ownerGrace, a.cfg.ForgetAfter).Nanoseconds()
	a.ownMu.Lock()
	for job, o := range a.owners {
		if carried[job] {
			o.seen = now
		} else if o.seen < old {
			delete(a.owners, job)
			if a.ownedBy[o.uid]--; a.ownedBy[o.uid] <= 0 {
				delete(a.ownedBy, o.uid)
			}
		}
	}
	a.ownMu.Unlock()
}

// carriedJobs are the jobs the open connections write: the one each last
// wrote a line for, and the one of its step records.
func (a *Agent) carriedJobs() map[string]bool {
	carried := map[string]bool{}
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, info := range a.conns {
		if p := info.owned.Load(); p != nil {
			carried[*p] = true
		}
		if s := info.rank.Load(); s != nil {
			carried[s.job] = true
		}
	}
	return carried
}

// peerUID is the user of the process at the other end of an intake
// connection, -1 if it cannot be read.
func peerUID(c net.Conn) int64 {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return -1
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return -1
	}
	uid := int64(-1)
	raw.Control(func(fd uintptr) { uid = fdPeerUID(fd) })
	return uid
}
