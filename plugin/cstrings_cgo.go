package plugin

/*
#include <stdlib.h>
*/
import "C"

import "sync"

// cStrings keeps the name/pciPath strings getProperties hands NCCL alive
// forever: NCCL stores the pointers (name is its topology key) and never
// frees them. One copy per distinct string, however often NCCL asks.
var cStrings struct {
	sync.Mutex
	m map[string]*C.char
}

func persistentCString(s string) *C.char {
	if s == "" {
		return nil
	}
	cStrings.Lock()
	defer cStrings.Unlock()
	if cStrings.m == nil {
		cStrings.m = map[string]*C.char{}
	}
	if p, ok := cStrings.m[s]; ok {
		return p
	}
	p := C.CString(s)
	cStrings.m[s] = p
	return p
}
