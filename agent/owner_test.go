package agent

import (
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
