// lint-unsafe checks the file-naming rule of CONVENTIONS.md §1, so that unsafe
// and cgo code stays in files named for it (as gVisor does):
//
//   - a file that imports "unsafe" is named *_unsafe.go, *_unsafe_test.go,
//     or *_cgo.go / *_cgo_test.go when it uses cgo;
//   - a *_unsafe.go or *_unsafe_test.go file imports "unsafe";
//   - a file that imports "C" (cgo) is named *_cgo.go or *_cgo_test.go.
//
// Usage: go run ./scripts/lint-unsafe [-allow FILE] [PATH...]
//
// With no PATH it checks every Go file git knows in the repository (tracked,
// or untracked and not ignored), testdata excluded. Files listed in the
// -allow file are known violations in code not yet renamed: they are reported
// as such and do not fail the check, but an allowed file that no longer
// violates the rule fails it, so the list only shrinks (an allowed file that
// is gone, e.g. renamed, is only reported). Exit status 1 on any finding.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

func main() {
	allowFile := flag.String("allow", "", "file listing known violations, one path a line (# comments)")
	flag.Parse()
	files := flag.Args()
	if len(files) == 0 {
		out, err := exec.Command("git", "ls-files", "--cached", "--others", "--exclude-standard", "*.go").Output()
		if err != nil {
			fmt.Fprintln(os.Stderr, "lint-unsafe: git ls-files:", err)
			os.Exit(2)
		}
		for _, f := range strings.Fields(string(out)) {
			if !strings.Contains("/"+f, "/testdata/") {
				if _, err := os.Stat(f); err == nil { // deleted but not yet committed
					files = append(files, f)
				}
			}
		}
	}
	allowed := map[string]bool{}
	if *allowFile != "" {
		f, err := os.Open(*allowFile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "lint-unsafe:", err)
			os.Exit(2)
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if l := strings.TrimSpace(sc.Text()); l != "" && !strings.HasPrefix(l, "#") {
				allowed[l] = true
			}
		}
		f.Close()
	}
	sort.Strings(files)
	bad, known := 0, 0
	fset := token.NewFileSet()
	for _, path := range files {
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			fmt.Printf("%s: cannot parse: %v\n", path, err)
			bad++
			continue
		}
		usesUnsafe, usesC := false, false
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			usesUnsafe = usesUnsafe || p == "unsafe"
			usesC = usesC || p == "C"
		}
		base := filepath.Base(path)
		unsafeName := strings.HasSuffix(base, "_unsafe.go") || strings.HasSuffix(base, "_unsafe_test.go")
		cgoName := strings.HasSuffix(base, "_cgo.go") || strings.HasSuffix(base, "_cgo_test.go")
		var why string
		switch {
		case usesC && !cgoName:
			why = `imports "C": name it *_cgo.go`
		case usesUnsafe && !unsafeName && !cgoName:
			why = `imports "unsafe": name it *_unsafe.go (*_unsafe_test.go for a test)`
		case unsafeName && !usesUnsafe:
			why = `is named *_unsafe but does not import "unsafe": drop the suffix`
		}
		switch {
		case why != "" && allowed[path]:
			fmt.Printf("%s: %s (known, listed in %s)\n", path, why, *allowFile)
			known++
		case why != "":
			fmt.Printf("%s: %s\n", path, why)
			bad++
		case allowed[path]:
			fmt.Printf("%s: follows the rule now: remove it from %s\n", path, *allowFile)
			bad++
		}
	}
	seen := map[string]bool{}
	for _, f := range files {
		seen[f] = true
	}
	var gone []string
	for f := range allowed {
		if !seen[f] {
			gone = append(gone, f)
		}
	}
	sort.Strings(gone)
	for _, f := range gone {
		// A rename by another branch; not a failure, so merges stay smooth.
		fmt.Printf("%s: no longer exists: drop it from %s\n", f, *allowFile)
	}
	if bad > 0 {
		fmt.Printf("lint-unsafe: %d finding(s) in %d Go files (CONVENTIONS.md §1)\n", bad, len(files))
		os.Exit(1)
	}
	fmt.Printf("lint-unsafe: %d Go files follow the unsafe/cgo file rule (%d known exceptions)\n", len(files), known)
}
