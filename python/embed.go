// Package python carries the tpsprof Python package inside the Go binary,
// so that `tpsprof launch` can put it on a training command's PYTHONPATH
// with nothing installed (see Extract).
// It owns the embedded files and their extraction into a private folder;
// it never runs Python.
package python

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/tpsprof/tpsprof/internal/safefs"
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
// on one node see either nothing or every file. root must be the user's
// own and writable by no one else (made 0700 when missing); an existing
// copy is used only when it holds exactly the binary's files, byte for
// byte, else it is replaced.
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
	// root must be this user's alone: otherwise another user could plant a
	// package (or a module shadowing the standard library on PYTHONPATH)
	// that the training command would run.
	if err := safefs.PrivateDir(root); err != nil {
		return "", fmt.Errorf("python: the package folder: %w (--python-dir to choose another)", err)
	}
	switch err := verify(dir, files); {
	case err == nil:
		return dir, nil
	case errors.Is(err, fs.ErrNotExist):
	default:
		// ours, but not our bytes (an edited or half-removed copy): replaced
		if err := os.RemoveAll(dir); err != nil {
			return "", fmt.Errorf("python: %s differs from the binary's package (%v) and cannot be replaced: %w", dir, err, err)
		}
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
		// another launch won the race: its copy must be the same bytes
		if verr := verify(dir, files); verr == nil {
			return dir, nil
		}
		return "", fmt.Errorf("python: %w", err)
	}
	if err := verify(dir, files); err != nil {
		return "", fmt.Errorf("python: the unpacked package does not match the binary's: %w", err)
	}
	return dir, nil
}

// verify checks that dir holds exactly the package's files, byte for
// byte, in folders and files owned by this user that no one else can
// write: anything more (a planted module) or different is refused.
func verify(dir string, files []string) error {
	if _, err := os.Lstat(dir); err != nil {
		return err
	}
	if err := safefs.CheckPrivateDir(dir); err != nil {
		return err
	}
	want := map[string]bool{}
	for _, p := range files {
		want[filepath.FromSlash(p)] = true
	}
	seen := 0
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if d.IsDir() {
			if rel == "." {
				return nil
			}
			if d.Name() == "__pycache__" {
				// bytecode Python wrote beside the sources; it must be ours too
				if err := safefs.CheckPrivateDir(p); err != nil {
					return err
				}
				return filepath.SkipDir
			}
			return safefs.CheckPrivateDir(p)
		}
		if !want[rel] {
			return fmt.Errorf("unexpected file %s", p)
		}
		f, err := safefs.OpenRegular(p)
		if err != nil {
			return err
		}
		got, err := io.ReadAll(io.LimitReader(f, 1<<24))
		f.Close()
		if err != nil {
			return err
		}
		b, _ := Files.ReadFile(filepath.ToSlash(rel))
		if !bytes.Equal(got, b) {
			return fmt.Errorf("%s differs from the binary's copy", p)
		}
		seen++
		return nil
	})
	if err != nil {
		return err
	}
	if seen != len(files) {
		return fmt.Errorf("%s holds %d of the package's %d files", dir, seen, len(files))
	}
	return nil
}

// Boot is the zero-code folder under an extracted package.
func Boot(dir string) string { return filepath.Join(dir, filepath.FromSlash(BootDir)) }
