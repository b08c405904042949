// Package python carries the tpsprof Python package inside the Go binary,
// so that `tpsprof launch` can put it on a training command's PYTHONPATH
// with nothing installed (see Extract).
package python

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// Files is the package's source: tpsprof/*.py and tpsprof/_boot/*.py.
//
//go:embed tpsprof/*.py tpsprof/_boot/*.py
var Files embed.FS

// BootDir is the folder, under the directory Extract returns, whose
// sitecustomize turns on zero-code capture (with TPSPROF_AUTO=1).
const BootDir = "tpsprof/_boot"

// Extract writes the package under root (one folder per content hash, so
// binaries of different versions never share one) unless it is there
// already, and returns the directory to put on PYTHONPATH. The folder is
// written under a temporary name and renamed whole: concurrent launches
// on one node see either nothing or every file.
func Extract(root string) (string, error) {
	h := sha256.New()
	var files []string
	err := fs.WalkDir(Files, "tpsprof", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := Files.ReadFile(p)
		if err != nil {
			return err
		}
		files = append(files, p)
		fmt.Fprintf(h, "%s\x00%d\x00", p, len(b))
		h.Write(b)
		return nil
	})
	if err != nil {
		return "", err
	}
	dir := filepath.Join(root, "python-"+hex.EncodeToString(h.Sum(nil))[:16])
	if _, err := os.Stat(filepath.Join(dir, "tpsprof", "__init__.py")); err == nil {
		return dir, nil
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return "", fmt.Errorf("python: %w", err)
	}
	tmp, err := os.MkdirTemp(root, ".python-*")
	if err != nil {
		return "", fmt.Errorf("python: %w", err)
	}
	defer os.RemoveAll(tmp) // left only when the rename did not happen
	for _, p := range files {
		b, _ := Files.ReadFile(p)
		dst := filepath.Join(tmp, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return "", fmt.Errorf("python: %w", err)
		}
		if err := os.WriteFile(dst, b, 0o644); err != nil {
			return "", fmt.Errorf("python: %w", err)
		}
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return "", fmt.Errorf("python: %w", err)
	}
	if err := os.Rename(tmp, dir); err != nil {
		// another launch won the race: its copy is the same bytes
		if _, serr := os.Stat(filepath.Join(dir, "tpsprof", "__init__.py")); serr == nil {
			return dir, nil
		}
		return "", fmt.Errorf("python: %w", err)
	}
	return dir, nil
}

// Boot is the zero-code folder under an extracted package.
func Boot(dir string) string { return filepath.Join(dir, filepath.FromSlash(BootDir)) }
