// Package modzip holds the test that keeps this module fetchable with go get:
// docs/extending.md tells a vendor to depend on a published version, and the
// go command refuses a whole module whose zip would hold a file path it
// considers malformed (a ':' in a sysfs fixture's PCI directory was one), and
// silently leaves out symbolic links, so tests or tools that need them break
// in the module cache.
package modzip
