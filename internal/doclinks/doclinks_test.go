package doclinks

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"unicode"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const root = "../.."

// slug is GitHub's anchor for a heading's text (github-slugger): lower case,
// every character but letters, digits, marks, '_', '-' and ' ' dropped,
// each space a '-'. Markup is dropped first: a link keeps its text, HTML
// tags go, backticks and emphasis marks fall to the character rule.
func slug(heading string) string {
	heading = linkRE.ReplaceAllString(heading, "$1")
	heading = regexp.MustCompile(`<[^>]*>`).ReplaceAllString(heading, "")
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.IsMark(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

var (
	linkRE    = regexp.MustCompile(`\[((?:[^\[\]]|\[[^\]]*\])*)\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)
	headingRE = regexp.MustCompile(`^ {0,3}(#{1,6})\s+(.*?)(?:\s+#+)?\s*$`)
	htmlIDRE  = regexp.MustCompile(`<a\s+(?:name|id)="([^"]+)"`)
	codeRE    = regexp.MustCompile("`+[^`]*`+")
	fenceRE   = regexp.MustCompile("^ {0,3}(```|~~~)")
)

// prose returns the lines of a Markdown file outside fenced code blocks,
// keyed by line number.
func prose(text string) map[int]string {
	out := map[int]string{}
	fence := ""
	for i, line := range strings.Split(text, "\n") {
		if m := fenceRE.FindStringSubmatch(line); m != nil {
			switch fence {
			case "":
				fence = m[1]
			case m[1]:
				fence = ""
			}
			continue
		}
		if fence == "" {
			out[i+1] = line
		}
	}
	return out
}

// anchors returns the fragments a Markdown file defines: its headings'
// slugs (a repeated one gets -1, -2, ...) and explicit <a name|id>.
func anchors(text string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	lines := prose(text)
	nums := make([]int, 0, len(lines))
	for n := range lines {
		nums = append(nums, n)
	}
	sort.Ints(nums)
	for _, n := range nums {
		line := lines[n]
		for _, m := range htmlIDRE.FindAllStringSubmatch(line, -1) {
			out[m[1]] = true
		}
		m := headingRE.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		s := slug(m[2])
		if k := seen[s]; k > 0 {
			out[fmt.Sprintf("%s-%d", s, k)] = true
		} else {
			out[s] = true
		}
		seen[s]++
	}
	return out
}

// checker resolves link targets relative to the repository root.
type checker struct {
	t     *testing.T
	cache map[string]map[string]bool
}

// check reports a problem with target as written in from:line, resolved
// against dir (a directory relative to the repository root), or "".
func (c *checker) check(from string, line int, dir, target string) string {
	if target == "" || strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
		return ""
	}
	path, frag, _ := strings.Cut(target, "#")
	file := from
	if path != "" {
		file = filepath.Clean(filepath.Join(dir, path))
		if strings.HasPrefix(file, "..") {
			return fmt.Sprintf("%s:%d: %s leaves the repository", from, line, target)
		}
		st, err := os.Stat(filepath.Join(root, file))
		if err != nil {
			return fmt.Sprintf("%s:%d: %s: %s does not exist", from, line, target, file)
		}
		if st.IsDir() || frag == "" {
			return ""
		}
	}
	if frag == "" {
		return ""
	}
	if !strings.HasSuffix(file, ".md") {
		return fmt.Sprintf("%s:%d: %s: #%s in a file that is not Markdown", from, line, target, frag)
	}
	a, ok := c.cache[file]
	if !ok {
		b, err := os.ReadFile(filepath.Join(root, file))
		require.NoError(c.t, err)
		a = anchors(string(b))
		c.cache[file] = a
	}
	if !a[frag] {
		return fmt.Sprintf("%s:%d: %s: %s has no heading with anchor #%s", from, line, target, file, frag)
	}
	return ""
}

func markdownFiles(t *testing.T) []string {
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	require.NoError(t, err)
	require.NotEmpty(t, docs)
	files := []string{"README.md", "CONVENTIONS.md"}
	for _, d := range docs {
		rel, err := filepath.Rel(root, d)
		require.NoError(t, err)
		files = append(files, rel)
	}
	return files
}

// TestMarkdownLinksResolve: every relative link of README.md,
// CONVENTIONS.md and docs/*.md names an existing file, and every #fragment a
// heading of the file it points into.
func TestMarkdownLinksResolve(t *testing.T) {
	c := &checker{t: t, cache: map[string]map[string]bool{}}
	n := 0
	for _, f := range markdownFiles(t) {
		b, err := os.ReadFile(filepath.Join(root, f))
		require.NoError(t, err)
		for line, text := range prose(string(b)) {
			text = codeRE.ReplaceAllString(text, "")
			for _, m := range linkRE.FindAllStringSubmatch(text, -1) {
				n++
				target := strings.Trim(m[2], "<>")
				if p := c.check(f, line, filepath.Dir(f), target); p != "" {
					t.Error(p)
				}
			}
		}
	}
	assert.Greater(t, n, 20, "found almost no links: is the link pattern still right?")
}

// deployRefRE is a docs/<file>.md reference, with an optional anchor, in the
// alerting rules' annotations and the dashboard's descriptions.
var deployRefRE = regexp.MustCompile(`docs/[A-Za-z0-9_.-]+\.md(?:#[A-Za-z0-9_-]+)?`)

// TestDeployDocReferencesResolve: every docs/*.md reference in deploy/ (a
// runbook_url, "see docs/troubleshooting.md#data-path" in a description)
// names an existing file and heading, and so does a bare #anchor later on the
// line ("docs/troubleshooting.md lists each (#data-path for ..., #connection-set-up
// for ...)"), taken in the file of the reference before it.
func TestDeployDocReferencesResolve(t *testing.T) {
	c := &checker{t: t, cache: map[string]map[string]bool{}}
	files, err := filepath.Glob(filepath.Join(root, "deploy", "*", "*"))
	require.NoError(t, err)
	n := 0
	bareRE := regexp.MustCompile(`(?:^|[\s(,])#([a-z0-9][a-z0-9_-]*)`)
	for _, path := range files {
		rel, err := filepath.Rel(root, path)
		require.NoError(t, err)
		b, err := os.ReadFile(path)
		require.NoError(t, err)
		for i, line := range strings.Split(string(b), "\n") {
			refs := deployRefRE.FindAllStringIndex(line, -1)
			for _, loc := range refs {
				n++
				if p := c.check(rel, i+1, ".", line[loc[0]:loc[1]]); p != "" {
					t.Error(p)
				}
			}
			for _, m := range bareRE.FindAllStringSubmatchIndex(line, -1) {
				var file string
				for _, loc := range refs {
					if loc[1] <= m[2] {
						file, _, _ = strings.Cut(line[loc[0]:loc[1]], "#")
					}
				}
				if file == "" {
					continue
				}
				n++
				if p := c.check(rel, i+1, ".", file+"#"+line[m[2]:m[3]]); p != "" {
					t.Error(p)
				}
			}
		}
	}
	assert.Greater(t, n, 2, "found almost no docs/ references in deploy/")
}

// TestSlug pins the anchor rule on headings of this repository's kind.
func TestSlug(t *testing.T) {
	for in, want := range map[string]string{
		"Alerts": "alerts",
		"A killed peer and its forked child (`make e2e-kill`, `nccl_e2e.py kill`)": "a-killed-peer-and-its-forked-child-make-e2e-kill-nccl_e2epy-kill",
		"One round on the GPU host (e2e/gpu-round.sh, make gpu-round)":             "one-round-on-the-gpu-host-e2egpu-roundsh-make-gpu-round",
		"§1 unsafe and cgo live in files named for them":                           "1-unsafe-and-cgo-live-in-files-named-for-them",
		"Connection set-up":         "connection-set-up",
		"Use [the link](x.md) text": "use-the-link-text",
		"Metrics cost: 0.1 µs":      "metrics-cost-01-µs",
		"Dashboard and alerts":      "dashboard-and-alerts",
		"Build and test knobs":      "build-and-test-knobs",
	} {
		assert.Equal(t, want, slug(in), "slug(%q)", in)
	}
	a := anchors("# Tests\n\n```\n# not a heading\n```\n\n## Tests\n")
	assert.Equal(t, map[string]bool{"tests": true, "tests-1": true}, a)
}
