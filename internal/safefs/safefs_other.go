//go:build !unix

package safefs

import (
	"io/fs"
	"os"
)

func owner(fs.FileInfo) (int, bool) { return 0, false }

func openNoFollow(path string) (*os.File, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		return nil, err
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		return nil, &fs.PathError{Op: "open", Path: path, Err: ErrNotRegular}
	}
	return os.Open(path)
}

func setBlocking(*os.File) error { return nil }
