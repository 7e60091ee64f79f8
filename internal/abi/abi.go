// Package abi holds the facts of NCCL's C net ABI (per API version) that Go
// code outside the glue needs, so that the version-free contract in package
// nccl does not carry them.
package abi

// Largest virtual NIC, in physical devices, per API version
// (NCCL_NET_MAX_DEVS_PER_NIC): the glue refuses larger makeVDevice requests,
// so a transport never sees more members than MaxDevsPerNICV12.
const (
	MaxDevsPerNIC    = 4 // API v9 to v11
	MaxDevsPerNICV12 = 8 // API v12
)

// IDUndef is the v12 railId/planeId value for "undefined".
const IDUndef = -1

// ID converts an optional rail or plane id (nccl.OptionalID.Get) to its ABI
// value.
func ID(id int, known bool) int16 {
	if !known {
		return IDUndef
	}
	return int16(id)
}
