//go:build !linux

package testenv

import "os/exec"

// detach leaves the server in the test's process group.
func detach(*exec.Cmd) {}

// stopProcess kills the server.
func stopProcess(cmd *exec.Cmd) { _ = cmd.Process.Kill() }
