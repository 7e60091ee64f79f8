module github.com/libnccl-net-go/libnccl-net-go

go 1.26.8
