//go:build !race

package ib

const raceEnabled = false
