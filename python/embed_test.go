package python

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/tpsprof/tpsprof/internal/safefs"
)

// Extract unpacks the package into a private folder and uses an existing
// copy only when it is exactly the binary's: an edited module, an extra
// one (a planted module would shadow the standard library on PYTHONPATH)
// or a missing one gets the copy replaced.
func TestExtractVerifiesTheCopy(t *testing.T) {
	root := filepath.Join(t.TempDir(), "cache")
	dir, err := Extract(root)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(root); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("root %v %v, want 0700", fi, err)
	}
	init := filepath.Join(dir, "tpsprof", "__init__.py")
	want, _ := os.ReadFile(init)
	for name, spoil := range map[string]func(){
		"edited":  func() { os.WriteFile(init, []byte("import os; os.system('id')\n"), 0o644) },
		"planted": func() { os.WriteFile(filepath.Join(dir, "tpsprof", "_boot", "json.py"), []byte("x = 1\n"), 0o644) },
		"missing": func() { os.Remove(filepath.Join(dir, "tpsprof", "torch.py")) },
	} {
		spoil()
		got, err := Extract(root)
		if err != nil || got != dir {
			t.Fatalf("%s: %s %v", name, got, err)
		}
		if b, _ := os.ReadFile(init); string(b) != string(want) {
			t.Errorf("%s: __init__.py not restored", name)
		}
		if _, err := os.Stat(filepath.Join(dir, "tpsprof", "_boot", "json.py")); err == nil {
			t.Errorf("%s: the planted module is still there", name)
		}
		if _, err := os.Stat(filepath.Join(dir, "tpsprof", "torch.py")); err != nil {
			t.Errorf("%s: torch.py not restored: %v", name, err)
		}
	}
	// bytecode Python writes beside the sources is accepted
	os.Mkdir(filepath.Join(dir, "tpsprof", "__pycache__"), 0o755)
	os.WriteFile(filepath.Join(dir, "tpsprof", "__pycache__", "x.pyc"), []byte{1}, 0o644)
	if err := verify(dir, packageFiles(t)); err != nil {
		t.Errorf("a __pycache__ folder refused: %v", err)
	}
}

// A root folder another user can write, or made by another user first (a
// shared /tmp when HOME is unset), is refused: nothing is unpacked there
// and nothing there is used. chown needs root, which CI has.
func TestExtractRefusesAForeignRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test gives a folder to uid 4242 and needs root (CI runs as root)")
	}
	base := t.TempDir()
	open := filepath.Join(base, "open")
	os.Mkdir(open, 0o777)
	os.Chmod(open, 0o777)
	if _, err := Extract(open); !errors.Is(err, safefs.ErrNotPrivate) {
		t.Errorf("a 0777 root: %v, want refused", err)
	}
	// another user made the root and planted a package with our hash name
	squat := filepath.Join(base, "squat")
	dir, err := Extract(filepath.Join(base, "mine"))
	if err != nil {
		t.Fatal(err)
	}
	os.Mkdir(squat, 0o755)
	planted := filepath.Join(squat, filepath.Base(dir), "tpsprof")
	os.MkdirAll(planted, 0o755)
	os.WriteFile(filepath.Join(planted, "__init__.py"), []byte("raise SystemExit('planted')\n"), 0o644)
	filepath.Walk(squat, func(p string, _ os.FileInfo, _ error) error { return os.Lchown(p, 4242, 4242) })
	got, err := Extract(squat)
	if !errors.Is(err, safefs.ErrNotPrivate) {
		t.Fatalf("a root of uid 4242 holding a planted package: %q %v, want refused", got, err)
	}
}

func packageFiles(t *testing.T) []string {
	t.Helper()
	var files []string
	entries, _ := Files.ReadDir("tpsprof")
	for _, e := range entries {
		if !e.IsDir() {
			files = append(files, "tpsprof/"+e.Name())
		}
	}
	boot, _ := Files.ReadDir("tpsprof/_boot")
	for _, e := range boot {
		files = append(files, "tpsprof/_boot/"+e.Name())
	}
	return files
}
