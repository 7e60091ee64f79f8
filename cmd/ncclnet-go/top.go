package main

func runTop(c *cli, args []string) error { return failure{"not built yet"} }
