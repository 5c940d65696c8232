//! `runner`: the native command-line face of webshard.

fn main() {
    println!("runner: not yet");
}
