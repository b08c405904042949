//go:build !unix

package natsconn

import "io/fs"

func ownedByMe(fs.FileInfo) bool { return true }
