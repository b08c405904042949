package cli

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// Every "tpsprof CMD ... --flag" in user-facing text (the Go sources'
// strings and comments, the docs, the README, the Python package's
// messages) names a flag CMD has: a warning told users to pass
// `tpsprof launch --topology`, a flag that never existed.
func TestTextNamesOnlyFlagsThatExist(t *testing.T) {
	flags := map[string]map[string]bool{}
	helpFlag := regexp.MustCompile(`(?m)^\s+-([a-z][a-z0-9-]*)`)
	for _, c := range commands() {
		out, help, _ := run(t, c.name, "--help") // (usage goes to either stream)
		flags[c.name] = map[string]bool{"help": true}
		for _, m := range helpFlag.FindAllStringSubmatch(out+help, -1) {
			flags[c.name][m[1]] = true
		}
	}
	if len(flags["launch"]) < 10 || !flags["launch"]["dp"] || !flags["report"]["compare"] {
		t.Fatalf("flags read from --help: %v", flags)
	}
	root, err := filepath.Abs("../../../..")
	if err != nil {
		t.Fatal(err)
	}
	use := regexp.MustCompile(`tpsprof (demo|collector|agent|launch|report|trace|kineto|gpus|mfu)\b([^\n` + "`" + `"()]*)`)
	flag := regexp.MustCompile(`(?:^|[\s|/])--([a-z][a-z0-9-]*)`)
	checked := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if strings.HasPrefix(name, ".") && path != root || name == "testdata" || name == "node_modules" {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(name, "_test.go") || !(strings.HasSuffix(name, ".go") || strings.HasSuffix(name, ".md") || strings.HasSuffix(name, ".py")) {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range use.FindAllStringSubmatch(string(b), -1) {
			cmd, rest := m[1], m[2]
			if i := strings.Index(rest, " -- "); i >= 0 {
				rest = rest[:i] // the child command's own flags
			}
			for _, f := range flag.FindAllStringSubmatch(rest, -1) {
				checked++
				if !flags[cmd][f[1]] {
					rel, _ := filepath.Rel(root, path)
					t.Errorf("%s: %q names --%s, which tpsprof %s does not have", rel, strings.TrimSpace(m[0]), f[1], cmd)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 50 {
		t.Errorf("only %d flags named in the text: the scan finds too little", checked)
	}
}
