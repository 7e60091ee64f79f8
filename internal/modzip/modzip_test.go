package modzip

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/mod/module"
)

// TestModuleZipSafePaths: every file of the tree (tracked, or new and not
// ignored) can go into the module zip that go get downloads, by the go
// command's own rule (module.CheckFilePath), and none is a symbolic link,
// which the zip drops.
func TestModuleZipSafePaths(t *testing.T) {
	const root = "../.."
	out, err := exec.Command("git", "-C", root, "ls-files", "-z", "--cached", "--others", "--exclude-standard").Output()
	if err != nil {
		t.Skipf("not a git work tree (%v): nothing to check", err)
	}
	folded := map[string]string{}
	n := 0
	for _, path := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		fi, err := os.Lstat(filepath.Join(root, path))
		if err != nil {
			continue // deleted in the work tree
		}
		n++
		if err := module.CheckFilePath(path); err != nil {
			t.Errorf("go get refuses the whole module: %v; create it in the test instead (t.TempDir)", err)
		}
		if fi.Mode()&os.ModeSymlink != 0 {
			t.Errorf("%s: a symbolic link, which module zips leave out; create it in the test instead (os.Symlink)", path)
		}
		if other, dup := folded[strings.ToLower(path)]; dup && other != path {
			t.Errorf("%s and %s differ only in case: go get refuses the module", path, other)
		}
		folded[strings.ToLower(path)] = path
	}
	if n == 0 {
		t.Fatal("git listed no file")
	}
}
