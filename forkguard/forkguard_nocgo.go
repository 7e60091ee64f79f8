//go:build !cgo

package forkguard

import "errors"

// Without cgo there is no C host to fork from us, and no atfork handler.

func track(int) error  { return nil }
func untrack(int)      {}
func tracked(int) bool { return false }

// OpenInChild is a cgo-only test helper; without cgo it always fails.
func OpenInChild([]int) ([]bool, error) { return nil, errors.New("forkguard: built without cgo") }
