package netboot

import (
	"net/http"
	"time"
)

// loader serves an iPXE loader over HTTP, for UEFI HTTP Boot clients; the
// same fixed names as TFTP, nothing else.
func (s *Server) loader(w http.ResponseWriter, r *http.Request) {
	if s.Loaders.Dir == "" {
		http.Error(w, "firmware netboot is off (no --dhcp-interface)", http.StatusNotFound)
		return
	}
	f, err := s.Loaders.Open(r.PathValue("name"))
	if err != nil {
		http.Error(w, "not a loader", http.StatusNotFound)
		return
	}
	defer f.Close()
	w.Header().Set("Content-Type", "application/efi")
	http.ServeContent(w, r, "", time.Time{}, f)
}
