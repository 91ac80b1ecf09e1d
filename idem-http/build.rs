//! Tests that need a server are ignored, with the reason, when its variable is not set (and `CI`
//! is not): see `idem_build::server_cfgs`.

fn main() {
    idem_build::server_cfgs();
}
