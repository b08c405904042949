package safefs

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestPrivateDir(t *testing.T) {
	root := t.TempDir()
	d := filepath.Join(root, "a", "traces")
	if err := PrivateDir(d); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(d); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("made %v %v, want mode 0700", fi, err)
	}
	if err := PrivateDir(d); err != nil { // adopted again
		t.Fatalf("own folder refused: %v", err)
	}
	// group- or other-writable: refused, left as it was
	open := filepath.Join(root, "open")
	os.Mkdir(open, 0o777)
	os.Chmod(open, 0o777)
	if err := PrivateDir(open); !errors.Is(err, ErrNotPrivate) {
		t.Errorf("a 0777 folder: %v, want refused", err)
	}
	if fi, _ := os.Stat(open); fi.Mode().Perm() != 0o777 {
		t.Errorf("the refused folder was changed to %v", fi.Mode())
	}
	// a link to a folder of ours, planted at the name: refused
	link := filepath.Join(root, "link")
	os.Symlink(d, link)
	if err := PrivateDir(link); !errors.Is(err, ErrNotPrivate) {
		t.Errorf("a link: %v, want refused", err)
	}
	// a file at the name
	file := filepath.Join(root, "file")
	os.WriteFile(file, nil, 0o600)
	if err := PrivateDir(file); !errors.Is(err, ErrNotPrivate) {
		t.Errorf("a file: %v, want refused", err)
	}
}

// Another user's folder (made first in a shared /tmp) is refused, with its
// owner named. chown needs root, which CI has.
func TestPrivateDirOfAnotherUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test gives a folder to uid 4242 and needs root (CI runs as root)")
	}
	d := filepath.Join(t.TempDir(), "squat")
	os.Mkdir(d, 0o700)
	if err := os.Chown(d, 4242, 4242); err != nil {
		t.Fatal(err)
	}
	err := PrivateDir(d)
	if !errors.Is(err, ErrNotPrivate) {
		t.Fatalf("another user's folder: %v, want refused", err)
	}
	if want := "uid 4242"; !contains(err.Error(), want) {
		t.Errorf("error %q does not name the owner (%s)", err, want)
	}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }

// OpenRegular opens a regular file, and refuses at once a link, a folder,
// a device and a FIFO with no writer (where a plain open blocks forever).
func TestOpenRegular(t *testing.T) {
	dir := t.TempDir()
	reg := filepath.Join(dir, "t.json")
	os.WriteFile(reg, []byte("{}"), 0o600)
	f, err := OpenRegular(reg)
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 4)
	if n, _ := f.Read(b); string(b[:n]) != "{}" {
		t.Errorf("read %q", b[:n])
	}
	f.Close()
	link := filepath.Join(dir, "link.json")
	os.Symlink(reg, link)
	fifo := filepath.Join(dir, "fifo.json")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{link, dir, "/dev/null", fifo} {
		done := make(chan error, 1)
		go func() {
			f, err := OpenRegular(p)
			if f != nil {
				f.Close()
			}
			done <- err
		}()
		select {
		case err := <-done:
			if !errors.Is(err, ErrNotRegular) {
				t.Errorf("%s: %v, want ErrNotRegular", p, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: OpenRegular blocked", p)
		}
	}
}

// OutputDir refuses a folder others can write or another user's; files
// written with WriteFileAtomic never go through a link planted at the
// name the old writers used (NAME.tmp), and a link at the final name is
// replaced, not followed.
func TestOutputDirAndAtomicWrite(t *testing.T) {
	base := t.TempDir()
	dir := filepath.Join(base, "plots")
	if err := OutputDir(dir); err != nil {
		t.Fatal(err)
	}
	victim := filepath.Join(base, "victim")
	os.WriteFile(victim, []byte("mine"), 0o600)
	os.Symlink(victim, filepath.Join(dir, "fig.png.tmp"))
	os.Symlink(victim, filepath.Join(dir, "fig.svg"))
	for _, name := range []string{"fig.png", "fig.svg"} {
		if err := WriteFileAtomic(filepath.Join(dir, name), func(f *os.File) error { _, err := f.WriteString("plot"); return err }); err != nil {
			t.Fatal(err)
		}
		fi, err := os.Lstat(filepath.Join(dir, name))
		if err != nil || !fi.Mode().IsRegular() {
			t.Errorf("%s: %v %v", name, fi, err)
		}
	}
	if b, _ := os.ReadFile(victim); string(b) != "mine" {
		t.Errorf("written through a planted link: %q", b)
	}
	os.Chmod(dir, 0o777)
	if err := OutputDir(dir); err == nil || !strings.Contains(err.Error(), "writable by group or others") {
		t.Errorf("a folder others can write: %v", err)
	}
	os.Chmod(dir, 0o755)
	link := filepath.Join(base, "via")
	os.Symlink(dir, link)
	if err := OutputDir(link); err == nil || !strings.Contains(err.Error(), "not a folder") {
		t.Errorf("a link: %v", err)
	}
	if os.Geteuid() == 0 {
		other := filepath.Join(base, "theirs")
		os.Mkdir(other, 0o755)
		os.Chown(other, 4242, 4242)
		if err := OutputDir(other); err == nil || !strings.Contains(err.Error(), "belongs to uid 4242") {
			t.Errorf("another user's folder: %v", err)
		}
	}
}
