package agent

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// A socket shared between users (an agent run as a node service with
// --socket-mode 0666): a job belongs to the first user whose connection
// writes it; another user's steps, events and metadata for it are refused
// and counted; root may write any job; once no connection has carried a
// job for ForgetAfter, it is free again. The other users are real
// processes run under uids 4242 and 4343, so the test needs root.
func TestJobBelongsToItsUser(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to run clients as other users")
	}
	const python = "/usr/bin/python3" // a path every user may run (not a shim under /root)
	dir, err := os.MkdirTemp("", "tpsprof-owner")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	os.Chmod(dir, 0o755)
	a, _ := startWithNATS(t, Config{Socket: filepath.Join(dir, "a.sock"), SocketMode: 0o666, Node: "n0",
		ForgetAfter: 500 * time.Millisecond, FlushInterval: 5 * time.Millisecond})
	lines := int64(0)
	waitLine := func() {
		t.Helper()
		lines++
		for deadline := time.Now().Add(5 * time.Second); a.Stats().Lines < lines; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("line %d not read: %+v", lines, a.Stats())
			}
		}
	}
	// as writes one line from a process of user uid, as a rank would.
	as := func(uid uint32, line string) {
		t.Helper()
		cmd := exec.Command(python, "-c", "import socket, sys\ns = socket.socket(socket.AF_UNIX)\ns.connect(sys.argv[1])\ns.sendall(sys.argv[2].encode() + b'\\n')\ns.close()", a.Socket(), line)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("client as uid %d: %v\n%s", uid, err, out)
		}
		waitLine()
	}
	now := time.Now().UnixNano()
	step := func(job string, rank int) string {
		return fmt.Sprintf(`{"job":%q,"step":0,"rank":%d,"world_size":4,"tokens":10,"start_unix_ns":%d,"end_unix_ns":%d,"duration_ns":1000000}`,
			job, rank, now-1e6, now)
	}
	as(4242, step("a42", 0))                                                                                                       // 4242 takes a42
	as(4343, step("a42", 1))                                                                                                       // refused
	as(4343, `{"type":"meta","job":"a42","model_preset":"llama3-8b"}`)                                                             // refused
	as(4343, step("b43", 0))                                                                                                       // 4343 takes b43
	as(4242, fmt.Sprintf(`{"type":"event","job":"b43","kind":"eval","rank":0,"start_unix_ns":%d,"end_unix_ns":%d}`, now-1e6, now)) // refused
	c, err := net.Dial("unix", a.Socket())                                                                                         // root: trusted
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintln(c, step("a42", 2))
	waitLine()
	c.Close()
	st := a.Stats()
	if st.Records != 3 || st.Rejected["job:owner"] != 3 || st.Metas != 0 || st.Events != 0 {
		t.Errorf("records %d (want 3), job:owner rejections %d (want 3), metas %d, events %d: %+v", st.Records, st.Rejected["job:owner"], st.Metas, st.Events, st)
	}
	// No connection carries a42 now: past ForgetAfter (and the agent's
	// one-second sweep) another user may start a job of that name.
	time.Sleep(2500 * time.Millisecond)
	as(4343, step("a42", 3))
	if st := a.Stats(); st.Records != 4 || st.Rejected["job:owner"] != 3 {
		t.Errorf("a42 not free after ForgetAfter: records %d, rejections %v", st.Records, st.Rejected)
	}
}

// Attacks on a shared socket by another user (uid 4343, a real process)
// end in counted refusals, and the victim (uid 4242) is not locked out:
//   - junk lines for a job name (invalid records) claim nothing: one junk
//     line used to squat the name for good, 65,536 of them filled the
//     owner table and another user's new job lost every record;
//   - valid records for 4,100 distinct jobs: the user holds at most 4,096;
//   - connections held open: a user holds at most a quarter of them (a
//     user holding all 4,096 locked a real rank out, conn:too_many);
//   - capture subscriptions: the user's ranks make at most 128 of the
//     agent's 1,024 (1,030 one-job connections used them all up).
func TestSharedSocketAttacks(t *testing.T) {
	if os.Getuid() != 0 {
		t.Fatal("needs root to run clients as other users (CI runs as root)")
	}
	const python = "/usr/bin/python3"
	dir, err := os.MkdirTemp("", "tpsprof-attack")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	os.Chmod(dir, 0o755)
	a, _ := startWithNATS(t, Config{Socket: filepath.Join(dir, "a.sock"), SocketMode: 0o666, Node: "n0", MaxConnections: 16,
		FlushInterval: 5 * time.Millisecond, MaxLinesPerSec: -1})
	now := time.Now().UnixNano()
	step := func(job string, s int) string {
		return fmt.Sprintf(`{"job":%q,"step":%d,"rank":0,"world_size":1,"tokens":10,"start_unix_ns":%d,"end_unix_ns":%d,"duration_ns":1000000}`,
			job, s, now-1e6, now)
	}
	// run sends lines as uid over one connection, holding `hold` more
	// connections open for `secs` seconds (in the background when secs > 0)
	run := func(uid uint32, lines []string, hold int, secs float64) *exec.Cmd {
		t.Helper()
		script := `import socket, sys, time
path, hold, secs = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
held = []
for _ in range(hold):
    c = socket.socket(socket.AF_UNIX); c.connect(path); held.append(c)
s = socket.socket(socket.AF_UNIX); s.connect(path)
s.sendall(sys.stdin.buffer.read())
print("ready", flush=True)
time.sleep(secs)
`
		cmd := exec.Command(python, "-c", script, a.Socket(), fmt.Sprint(hold), fmt.Sprint(secs))
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
		var in []byte
		for _, l := range lines {
			in = append(in, l+"\n"...)
		}
		cmd.Stdin = bytesReader(in)
		return cmd
	}
	waitLines := func(n int64) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); a.Stats().Lines < n; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%d lines read of %d: %+v", a.Stats().Lines, n, a.Stats())
			}
		}
	}

	// junk claims nothing; the victim's job is the victim's
	var junk []string
	for i := range 200 {
		junk = append(junk, fmt.Sprintf(`{"job":"victim%d","step":"junk"}`, i))
	}
	if out, err := run(4343, junk, 0, 0).CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	waitLines(200)
	if out, err := run(4242, []string{step("victim7", 0)}, 0, 0).CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	waitLines(201)
	if st := a.Stats(); st.Records != 1 || st.Rejected["job:owner"] != 0 {
		t.Errorf("after 200 junk lines the victim's record: records %d, refusals %v", st.Records, st.Rejected)
	}

	// 4,100 valid jobs of one user: 4,096 held, 4 refused; its first 128
	// jobs' capture subscriptions made, the rest refused
	var many []string
	for i := range 4100 {
		many = append(many, step(fmt.Sprintf("flood%d", i), 0))
	}
	if out, err := run(4343, many, 0, 0).CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	waitLines(201 + 4100)
	st := a.Stats()
	if st.Rejected["job:owner_limit"] != 4 || st.Records != 1+4096 {
		t.Errorf("4,100 jobs of one user: records %d, refusals %v; want 4,096 held and 4 job:owner_limit", st.Records, st.Rejected)
	}
	if n := a.capSubN.Load(); n > maxCapSubsPerUID+1 {
		t.Errorf("%d capture subscriptions, one user's ranks may make %d", n, maxCapSubsPerUID)
	}
	if st.Rejected["capture:uid_limit"] == 0 {
		t.Errorf("no capture:uid_limit refusal: %v", st.Rejected)
	}
	// the victim's new job still goes in
	if out, err := run(4242, []string{step("victim8", 0)}, 0, 0).CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	waitLines(201 + 4100 + 1)
	if st := a.Stats(); st.Records != 1+4096+1 {
		t.Errorf("the victim's new job after the flood: records %d, refusals %v", st.Records, st.Rejected)
	}

	// connections: 4343 holds 10 of 16 (it may hold 4); the victim connects
	hog := run(4343, []string{step("flood0", 1)}, 10, 3)
	out, _ := hog.StdoutPipe()
	if err := hog.Start(); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 6)
	out.Read(buf) // "ready": its connections are open (or refused)
	if out, err := run(4242, []string{step("victim8", 1)}, 0, 0).CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	waitLines(201 + 4100 + 2)
	hog.Wait()
	if st := a.Stats(); st.Rejected["conn:uid_limit"] < 6 || st.Rejected["conn:too_many"] != 0 || st.Records < 1+4096+2 {
		t.Errorf("one user holding connections: refusals %v, records %d", st.Rejected, st.Records)
	}
}

func bytesReader(b []byte) *bytes.Reader { return bytes.NewReader(b) }
