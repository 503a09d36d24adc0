package netboot

import "strings"

// WithSigners adds the template's required signers to the kernel command
// line as tether.signers=, the node's signer anchor. Fingerprints are
// checked when the template is written, so they hold no space or quote.
func WithSigners(kernelArgs string, signers []string) string {
	if len(signers) == 0 {
		return kernelArgs
	}
	return strings.TrimSpace(kernelArgs + " tether.signers=" + strings.Join(signers, ","))
}
