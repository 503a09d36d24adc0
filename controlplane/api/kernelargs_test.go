package api_test

import (
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/tetherfleet/tether/internal/testkit/testcp"
	v1 "github.com/tetherfleet/tether/proto/tether/v1"
)

// Kernel arguments are one line in the iPXE script: a newline or any other
// control character would start a script command, so create and update
// refuse them, and ordinary arguments still pass.
func TestKernelArgsRefuseControlCharacters(t *testing.T) {
	cp := testcp.Start(t)
	ctx := ctxT(t)
	fleet := cp.SeedFleet(ctx, "edge")
	root := []*v1.ModuleRef{{Name: "edge-base", Version: "1"}}
	for name, args := range map[string]string{"newline": "console=ttyS0\nshell", "carriage return": "quiet\r", "nul": "a\x00b", "tab": "a\tb"} {
		t.Run(name, func(t *testing.T) {
			_, err := cp.Admin.CreateTemplate(ctx, &v1.CreateTemplateRequest{Name: "t1", RootModules: root, KernelArgs: args})
			wantMsg(t, err, codes.InvalidArgument, "kernel_args", "control character")
			_, err = cp.Admin.UpdateTemplate(ctx, &v1.UpdateTemplateRequest{Name: fleet.Template, UpdateMask: []string{"kernel_args"}, KernelArgs: args})
			wantMsg(t, err, codes.InvalidArgument, "kernel_args", "control character")
		})
	}
	if _, err := cp.Admin.CreateTemplate(ctx, &v1.CreateTemplateRequest{Name: "t2", RootModules: root, KernelArgs: "console=ttyS0 quiet tether.x=é"}); err != nil {
		t.Fatalf("plain arguments refused: %v", err)
	}
}
