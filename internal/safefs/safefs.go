// Package safefs creates and adopts folders and opens files in places
// other users of the machine can also write (/tmp above all) without
// letting them plant a folder, a symbolic link or a FIFO there first.
//
// A folder tpsprof writes into (the trace folder beside the intake socket,
// the unpacked Python package) must be the user's own and writable by no
// one else: then nobody else can create, replace or link anything inside
// it, and what is written there stays the user's. docs/security.md says
// where each is used.
package safefs

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// ErrNotPrivate means a path exists but is not a folder only its user can
// change: another user's, group- or other-writable, or not a folder.
var ErrNotPrivate = errors.New("not a private folder")

// PrivateDir makes dir (mode 0700, parents as MkdirAll makes them) or
// adopts an existing one when it is a real folder (not a link), owned by
// the effective user and not writable by group or others. Anything else is
// refused with an error that says whose it is and what to do, never
// changed: a folder someone else made must not be trusted, and its
// contents may already be theirs.
func PrivateDir(dir string) error {
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return err
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	return CheckPrivateDir(dir)
}

// CheckPrivateDir refuses dir unless it is a folder (not a link) of the
// effective user that group and others cannot write.
func CheckPrivateDir(dir string) error { return checkDir(dir, false) }

// checkDir refuses dir unless it is a folder (not a link) of the effective
// user (or, with rootToo, root) that group and others cannot write.
func checkDir(dir string, rootToo bool) error {
	fi, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s is not a folder (%s): %w; remove it or choose another path", dir, fi.Mode().Type(), ErrNotPrivate)
	}
	if uid, ok := owner(fi); ok && uid != os.Geteuid() && (!rootToo || uid != 0) {
		return fmt.Errorf("%s belongs to uid %d, not to you (uid %d): %w; another user may have made it to plant files; remove it or choose another path", dir, uid, os.Geteuid(), ErrNotPrivate)
	}
	if fi.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("%s is writable by group or others (mode %04o): %w; chmod go-w it or choose another path", dir, fi.Mode().Perm(), ErrNotPrivate)
	}
	return nil
}

// OutputDir makes dir (parents as MkdirAll makes them, mode 0755) or
// adopts an existing one for files a user asked for (report --plots DIR,
// --html FILE's folder): a real folder (not a link) of the effective user
// or root that group and others cannot write. In a folder another user can
// write, a link planted at a file's name is followed, and what is written
// read and changed; such a folder is refused, naming it. Files go in with
// WriteFileAtomic, which never writes through a link.
func OutputDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return checkDir(dir, true)
}

// WriteFileAtomic writes path through write: into a new file of a random
// name beside it (O_EXCL: never a planted link), renamed into place (a
// rename replaces the name, never follows it), so that a reader never sees
// half of it.
func WriteFileAtomic(path string, write func(*os.File) error) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return err
	}
	err = write(f)
	if err == nil {
		err = f.Chmod(0o644)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
	}
	return err
}

// ErrNotRegular means a path is not a regular file (a link, a FIFO, a
// device, a folder).
var ErrNotRegular = errors.New("not a regular file")

// OpenRegular opens path for reading only when it is a regular file: it
// does not follow a final symbolic link and does not block on a FIFO or a
// device swapped in after an earlier check (the file is opened
// non-blocking, checked with fstat, then read normally).
func OpenRegular(path string) (*os.File, error) {
	f, err := openNoFollow(path)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("%s: %w (%s)", path, ErrNotRegular, fi.Mode().Type())
	}
	if err := setBlocking(f); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// NewPrivateDir makes dir fresh (mode 0700; an existing path of that name
// is refused, whoever made it) and holds it open: files made through the
// returned Root (CreateNew) land in that folder however its path is
// renamed or replaced afterwards, and never through a link. It checks the
// folder it holds is the effective user's and writable by no one else.
// Its parent is made as MkdirAll makes it and may be shared.
func NewPrivateDir(dir string) (*os.Root, error) {
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return nil, err
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, err
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, err
	}
	fi, err := root.Stat(".")
	if err == nil {
		switch uid, ok := owner(fi); {
		case !fi.IsDir():
			err = fmt.Errorf("%s is not a folder: %w", dir, ErrNotPrivate)
		case ok && uid != os.Geteuid():
			err = fmt.Errorf("%s was replaced by uid %d's folder before it was opened: %w", dir, uid, ErrNotPrivate)
		case fi.Mode().Perm()&0o077 != 0:
			err = fmt.Errorf("%s has mode %04o, not 0700: %w", dir, fi.Mode().Perm(), ErrNotPrivate)
		}
	}
	if err != nil {
		root.Close()
		return nil, err
	}
	return root, nil
}

// CreateNew writes data to a new file name (no path separators) in root,
// mode 0600: an existing entry of that name, a link above all, is refused,
// never followed or overwritten.
func CreateNew(root *os.Root, name string, data []byte) error {
	if name == "" || name != filepath.Base(name) || name == "." || name == ".." {
		return fmt.Errorf("%q: not a plain file name", name)
	}
	f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// Owner is the uid owning the file fi describes (false where the platform
// does not say).
func Owner(fi fs.FileInfo) (int, bool) { return owner(fi) }
