package testenv

import (
	_ "embed"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"testing"
	"time"
)

// SQSVar names an SQS-compatible endpoint (http://host:port) that speaks the current SDK's JSON
// protocol. Without it the tests start moto_server themselves when it is on PATH.
const SQSVar = "IDEM_SQS_URL"

// motoServer is the moto_server this test process started, shared by its tests.
var motoServer struct {
	sync.Mutex
	url    string
	cmd    *exec.Cmd
	err    error
	script string // the motoServerPy file it runs, removed when it stops
}

// motoServerPy runs moto's server with a race of its SQS queues fixed (see the file). The tests
// run it with python3 when that interpreter has moto, and plain moto_server otherwise.
//
//go:embed motoserver.py
var motoServerPy []byte

// SQS returns the endpoint of an SQS-compatible server: IDEM_SQS_URL when set, else a
// moto_server (Python moto 5, whose server speaks SQS's JSON protocol) that this test process
// starts on a free loopback port once and stops when Run returns. Without either it skips the
// test, naming both, or fails it when IDEM_REQUIRE_SERVICES=1. Any static credentials and
// region us-east-1 work with moto.
func SQS(t testing.TB) string {
	t.Helper()
	if v := os.Getenv(SQSVar); v != "" {
		return v
	}
	path, err := exec.LookPath("moto_server")
	if err != nil {
		if Required() {
			t.Fatalf("%s is not set, moto_server is not on PATH, and %s=1: this test needs an SQS-compatible server", SQSVar, RequireVar)
		}
		skips.Lock()
		if skips.byVar == nil {
			skips.byVar = map[string]int{}
		}
		skips.byVar[SQSVar+" (or moto_server on PATH)"]++
		skips.Unlock()
		t.Skipf("skipping: set %s or put moto_server (Python moto 5) on PATH to run this test against an SQS-compatible server", SQSVar)
	}
	motoServer.Lock()
	defer motoServer.Unlock()
	if motoServer.url == "" && motoServer.err == nil {
		motoServer.url, motoServer.cmd, motoServer.err = startPatchedMoto()
		if motoServer.err != nil {
			motoServer.url, motoServer.cmd, motoServer.err = startMoto(path)
		}
	}
	if motoServer.err != nil {
		t.Fatalf("start %s: %v", path, motoServer.err)
	}
	return motoServer.url
}

// startPatchedMoto runs motoServerPy with python3 on a free loopback port.
func startPatchedMoto() (string, *exec.Cmd, error) {
	python, err := exec.LookPath("python3")
	if err != nil {
		return "", nil, err
	}
	f, err := os.CreateTemp("", "idem-motoserver-*.py")
	if err != nil {
		return "", nil, err
	}
	motoServer.script = f.Name()
	_, err = f.Write(motoServerPy)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", nil, err
	}
	return startMoto(python, motoServer.script)
}

// startMoto runs moto's server (path and its first arguments) on a free loopback port and waits
// until it answers.
func startMoto(path string, args ...string) (string, *exec.Cmd, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	cmd := exec.Command(path, append(args, "-H", "127.0.0.1", "-p", strconv.Itoa(port))...)
	detach(cmd)
	if err := cmd.Start(); err != nil {
		return "", nil, err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	deadline := time.Now().Add(30 * time.Second)
	for {
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			_ = c.Close()
			return "http://" + addr, cmd, nil
		}
		select {
		case err := <-exited:
			return "", nil, fmt.Errorf("%s exited before listening on %s: %v", path, addr, err)
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			stopProcess(cmd)
			return "", nil, fmt.Errorf("moto_server did not listen on %s within 30s", addr)
		}
	}
}

// stopSQS stops the moto_server this process started, if any.
func stopSQS() {
	motoServer.Lock()
	defer motoServer.Unlock()
	if motoServer.cmd != nil {
		stopProcess(motoServer.cmd)
		motoServer.cmd = nil
		motoServer.url = ""
	}
	if motoServer.script != "" {
		_ = os.Remove(motoServer.script)
		motoServer.script = ""
	}
}
