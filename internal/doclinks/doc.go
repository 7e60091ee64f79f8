// Package doclinks holds the test that keeps the repository's documentation
// navigable: every relative link of README.md, CONVENTIONS.md and docs/*.md,
// and every docs/*.md reference in deploy/ (the alerts' runbook_url and
// descriptions, the dashboard), names a file that exists and, with a
// #fragment, a heading of that file under GitHub's anchor rules.
package doclinks
