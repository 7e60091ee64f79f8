package main

func runEnv(c *cli, args []string) error { return failure{"not built yet"} }
