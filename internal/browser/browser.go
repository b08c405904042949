// Package browser drives a headless Chromium for the tests that read a
// page as a user's browser renders it (the live page, the HTML report).
package browser

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"time"
)

// Find is the path of a Chromium-family browser on PATH.
func Find() (string, error) {
	for _, b := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(b); err == nil {
			return p, nil
		}
	}
	return "", errors.New("no headless browser: install Debian's chromium package (.ci/run installs it)")
}

// Args are the flags every headless run takes: no sandbox (CI runs as
// root), no GPU, nothing fetched from the network, its profile in dir.
func Args(dir string) []string {
	return []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync", "--user-data-dir=" + dir}
}

// DumpDOM loads url (http:// or file://) and returns the DOM once its
// scripts ran, with dir as the browser's profile and home.
func DumpDOM(url, dir string) (string, error) {
	b, err := Find()
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, b, append(Args(dir), "--virtual-time-budget=5000", "--dump-dom", url)...)
	cmd.Env = append(os.Environ(), "HOME="+dir)
	out, err := cmd.Output()
	if err != nil {
		return "", err
	}
	return string(out), nil
}
