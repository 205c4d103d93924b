//! Empty: this crate exists to build turbojpeg-sys (libjpeg-turbo 3.x) from source.
