#!/bin/sh
# A C++ compiler wrapper whose compile server never answers: it stands for a site's
# distcc/icecc/sccache wrapper set as CXX, waiting on a server (or a cache lock) that is
# gone. It never runs the compiler and never exits.
sleep 86400
