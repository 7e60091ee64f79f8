package plugin

// Version is the plugin's release, printed in the init INFO line and exported in
// the metrics info series. Builds may override it with
// -ldflags "-X github.com/libnccl-net-go/libnccl-net-go/plugin.Version=...".
var Version = "0.1.0"
