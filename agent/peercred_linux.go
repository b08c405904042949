package agent

import "syscall"

func fdPeerUID(fd uintptr) int64 {
	cred, err := syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	if err != nil {
		return -1
	}
	return int64(cred.Uid)
}
