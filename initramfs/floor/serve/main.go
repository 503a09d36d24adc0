// Command serve is the floor harness's file server: it serves a folder on
// the loopback interface (QEMU's user networking shows the host's loopback
// to the guest as 10.0.2.2) and writes the port it got to a file.
package main

import (
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
)

func main() {
	dir := flag.String("dir", ".", "folder to serve")
	listen := flag.String("listen", "127.0.0.1:0", "address to listen on (loopback only)")
	portFile := flag.String("port-file", "", "write the chosen port here")
	flag.Parse()

	host, _, err := net.SplitHostPort(*listen)
	if err != nil || !net.ParseIP(host).IsLoopback() {
		log.Fatalf("serve: %q is not a loopback address", *listen)
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	if *portFile != "" {
		if err := os.WriteFile(*portFile, []byte(fmt.Sprint(port)), 0o644); err != nil {
			log.Fatal(err)
		}
	}
	log.Fatal(http.Serve(ln, http.FileServer(http.Dir(*dir))))
}
