package tetherv1_test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestGeneratedCodeIsFresh regenerates the Go code into a temp dir with the
// pinned plugins and fails if it differs from what is committed.
func TestGeneratedCodeIsFresh(t *testing.T) {
	protoc, err := exec.LookPath("protoc")
	if err != nil {
		msg := "SKIP: protoc not installed (apt-get install protobuf-compiler libprotobuf-dev); cannot check generated code"
		fmt.Fprintln(os.Stderr, msg)
		t.Skip(msg)
	}
	if _, err := os.Stat("/usr/include/google/protobuf/timestamp.proto"); err != nil {
		msg := "SKIP: protobuf well-known types missing (apt-get install libprotobuf-dev); cannot check generated code"
		fmt.Fprintln(os.Stderr, msg)
		t.Skip(msg)
	}
	plugin := func(name string) string {
		out, err := exec.Command("go", "tool", "-n", name).Output()
		if err != nil {
			t.Fatalf("go tool -n %s: %v", name, err)
		}
		return string(bytes.TrimSpace(out))
	}
	root := filepath.Join("..", "..", "..")
	out := t.TempDir()
	protos, _ := filepath.Glob("*.proto")
	args := []string{"-I", filepath.Join(root, "proto"), "-I", "/usr/include",
		"--plugin=protoc-gen-go=" + plugin("protoc-gen-go"), "--plugin=protoc-gen-go-grpc=" + plugin("protoc-gen-go-grpc"),
		"--go_out=" + out, "--go_opt=module=github.com/tetherfleet/tether",
		"--go-grpc_out=" + out, "--go-grpc_opt=module=github.com/tetherfleet/tether"}
	for _, p := range protos {
		args = append(args, filepath.Join(root, "proto", "tether", "v1", p))
	}
	if b, err := exec.Command(protoc, args...).CombinedOutput(); err != nil {
		t.Fatalf("protoc: %v\n%s", err, b)
	}
	gen, _ := filepath.Glob(filepath.Join(out, "proto", "tether", "v1", "*.go"))
	if len(gen) == 0 {
		t.Fatal("protoc generated nothing")
	}
	for _, g := range gen {
		want, err := os.ReadFile(g)
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Base(g))
		if err != nil {
			t.Fatalf("%s is generated but not committed", filepath.Base(g))
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s is stale: run `make generate` and commit the result", filepath.Base(g))
		}
	}
}
