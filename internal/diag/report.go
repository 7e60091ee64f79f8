package diag

// Report is the answer to "what would the plugin expose on this host, and why".
type Report struct {
	// Transport is the transport the plugin would pick; "" when init would fail.
	Transport string `json:"transport"`
	// Why says in one sentence how that choice was made.
	Why string `json:"why"`
	// Forced is NCCL_GO_TRANSPORT when set.
	Forced string `json:"forced,omitempty"`
	// InitError is the error the plugin's init would return (nothing usable,
	// or an unknown NCCL_GO_TRANSPORT).
	InitError string `json:"init_error,omitempty"`
	// Transports lists every registered transport in the order the plugin
	// tries them. Each one is surveyed, including those the plugin would not
	// reach, so that the report can say what they would have found.
	Transports []Transport `json:"transports"`
}

// Transport is one transport's discovery.
type Transport struct {
	Name     string `json:"name"`
	Priority int    `json:"priority"`
	// Tried: the plugin's init would call this transport's Init (it comes
	// before the chosen one, or is the one NCCL_GO_TRANSPORT names).
	Tried bool `json:"tried"`
	// Selected: the plugin would use this transport.
	Selected bool `json:"selected"`
	// Usable: its Init succeeded with at least one device.
	Usable bool `json:"usable"`
	// Reason says why it is not usable (Init's error) or not tried.
	Reason string `json:"reason,omitempty"`
	// ConfigError: Init failed with a configuration error (a WARN in the
	// plugin), not merely for lack of a device (an INFO).
	ConfigError bool `json:"config_error,omitempty"`
	// Devices is what NCCL's devices/getProperties would report: the
	// physical devices, then the virtual NICs NCCL's fusion would create.
	Devices []Device `json:"devices,omitempty"`
	// Ports lists every RDMA port the transport saw, used or not (ib).
	Ports []Port `json:"ports,omitempty"`
	// Interfaces lists every network interface with whether it matches
	// NCCL_SOCKET_IFNAME (or NCCL's default search) and is used (socket).
	Interfaces []Interface `json:"interfaces,omitempty"`
	// Handshake is the interface the out-of-band TCP handshake uses (ib).
	Handshake *Interface `json:"handshake,omitempty"`
	// Fusion is the outcome of replaying NCCL's NIC fusion.
	Fusion *Fusion `json:"fusion,omitempty"`
	// Notes are further facts worth knowing (missing optional verbs, ...).
	Notes []string `json:"notes,omitempty"`
	// Log is what the transport logged during discovery, as the plugin
	// would log it through NCCL ("WARN ..." / "INFO ...").
	Log []string `json:"log,omitempty"`
}

// Device is one device as NCCL sees it, with what the transport knows about it.
type Device struct {
	Index     int      `json:"index"`
	Name      string   `json:"name"`
	Port      int      `json:"port,omitempty"`
	SpeedMbps int      `json:"speed_mbps"`
	PCIPath   string   `json:"pci_path"`
	GUID      string   `json:"guid"`
	Memory    []string `json:"memory"` // host, cuda, dmabuf: what regMr accepts
	MaxComms  int      `json:"max_comms"`
	MaxRecvs  int      `json:"max_recvs"`
	// RailID is the rail NCCL's RAIL merge policy groups by; nil when the
	// transport reports none.
	RailID *int `json:"rail_id,omitempty"`
	// Members are the physical devices of a virtual NIC (NCCL's vProps).
	Members []int `json:"members,omitempty"`
	Virtual bool  `json:"virtual,omitempty"`
	// Transport-specific facts.
	LinkLayer   string `json:"link_layer,omitempty"`
	State       string `json:"state,omitempty"`
	MTU         int    `json:"mtu,omitempty"`
	GIDIndex    *int   `json:"gid_index,omitempty"`
	GID         string `json:"gid,omitempty"`
	RoCEVersion int    `json:"roce_version,omitempty"`
	NetDev      string `json:"netdev,omitempty"`
	Address     string `json:"address,omitempty"`
}

// Port is one RDMA port and the transport's verdict on it.
type Port struct {
	Device      string `json:"device"`
	Port        int    `json:"port"`
	State       string `json:"state"`
	LinkLayer   string `json:"link_layer"`
	SpeedMbps   int    `json:"speed_mbps,omitempty"`
	MTU         int    `json:"mtu,omitempty"`
	GIDIndex    *int   `json:"gid_index,omitempty"`
	GID         string `json:"gid,omitempty"`
	RoCEVersion int    `json:"roce_version,omitempty"`
	NetDev      string `json:"netdev,omitempty"`
	PCIPath     string `json:"pci_path,omitempty"`
	Used        bool   `json:"used"`
	DeviceIndex *int   `json:"device_index,omitempty"`
	Why         string `json:"why,omitempty"`
}

// Interface is one network interface and the transport's verdict on it.
type Interface struct {
	Name    string   `json:"name"`
	Up      bool     `json:"up"`
	Running bool     `json:"running"`
	Addrs   []string `json:"addrs,omitempty"`
	// Matches: selected by NCCL_SOCKET_IFNAME, or by the step of NCCL's
	// default search that found interfaces.
	Matches     bool   `json:"matches"`
	Used        bool   `json:"used"`
	Address     string `json:"address,omitempty"`
	DeviceIndex *int   `json:"device_index,omitempty"`
	Why         string `json:"why,omitempty"`
}

// Fusion is NCCL's NIC fusion replayed against the transport.
type Fusion struct {
	// Supported: the transport implements makeVDevice (else the glue hands
	// NCCL a NULL makeVDevice and NCCL uses the physical devices).
	Supported bool   `json:"supported"`
	Level     string `json:"merge_level"`           // NCCL_NET_MERGE_LEVEL as NCCL reads it
	Force     string `json:"force_merge,omitempty"` // NCCL_NET_FORCE_MERGE
	Policy    string `json:"merge_policy"`          // NCCL_NET_MERGE_POLICY
	// MaxPerNIC is NCCL_NET_MAX_DEVS_PER_NIC for the newest API (v12).
	MaxPerNIC int    `json:"max_devs_per_nic"`
	VNICs     []VNIC `json:"vnics,omitempty"`
	// Error is what NCCL's topology code would fail with (a force-merge
	// group that names missing devices, or that the transport refuses).
	Error string   `json:"error,omitempty"`
	Notes []string `json:"notes,omitempty"`
}

// VNIC is one virtual NIC NCCL would create.
type VNIC struct {
	Index   int      `json:"index"`
	Members []int    `json:"members"`
	Names   []string `json:"names"`
	Path    string   `json:"path"` // the farthest PCI distance between members (PORT, PIX, ...)
	Forced  bool     `json:"forced,omitempty"`
}
