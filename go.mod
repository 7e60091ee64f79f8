module github.com/libnccl-net-go/libnccl-net-go

go 1.26.8

require (
	github.com/prometheus/client_golang v1.25.0 // indirect
	github.com/stretchr/testify v1.12.1 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/sys v0.49.0 // indirect
)
