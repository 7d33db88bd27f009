#![allow(unused)]
use std::hint::black_box;
use std::time::Instant;

const SIZES: [usize; 5] = [8, 64, 1024, 8192, 65536];
const HDR: [u8; 64] = [0x5a; 64];

/// median ns/op of 5 runs, each ~0.2 s
fn bench<F: FnMut()>(mut f: F) -> f64 {
    let mut n: u64 = 1;
    loop {
        let t = Instant::now();
        for _ in 0..n { f(); }
        let e = t.elapsed().as_secs_f64();
        if e > 0.02 { n = ((n as f64) * 0.2 / e).max(1.0) as u64; break; }
        n *= 2;
    }
    let mut v: Vec<f64> = (0..5).map(|_| {
        let t = Instant::now();
        for _ in 0..n { f(); }
        t.elapsed().as_nanos() as f64 / n as f64
    }).collect();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[2]
}

fn report(imp: &str, alg: &str, op: &str, size: usize, ns: f64) {
    if size > 0 {
        println!("{imp:8} {alg:6} {op:14} {size:6} {ns:12.1} ns {:8.3} GB/s", size as f64 / ns);
    } else {
        println!("{imp:8} {alg:6} {op:14} {:>6} {ns:12.1} ns", "-");
    }
}

macro_rules! ring_like {
    ($modname:ident, $cr:ident, $label:expr) => {
        mod $modname {
            use super::*;
            use $cr::aead::{Aad, LessSafeKey, Nonce, UnboundKey, Algorithm, AES_128_GCM, CHACHA20_POLY1305};
            use $cr::hkdf;
            fn nonce() -> Nonce { Nonce::assume_unique_for_key(black_box([7u8; 12])) }
            fn run_alg(alg: &'static Algorithm, name: &str, klen: usize) {
                let kb = vec![0x11u8; klen];
                let ns = bench(|| { black_box(LessSafeKey::new(UnboundKey::new(alg, black_box(&kb)).unwrap())); });
                report($label, name, "key_setup", 0, ns);
                let key = LessSafeKey::new(UnboundKey::new(alg, &kb).unwrap());
                for &sz in SIZES.iter() {
                    let data = vec![0xabu8; sz];
                    // (a) tag only: empty plaintext, data as AAD
                    let mut empty: [u8; 0] = [];
                    let ns = bench(|| { black_box(key.seal_in_place_separate_tag(nonce(), Aad::from(black_box(&data[..])), &mut empty).unwrap()); });
                    report($label, name, "tag_seal", sz, ns);
                    let tag = key.seal_in_place_separate_tag(nonce(), Aad::from(&data[..]), &mut empty).unwrap();
                    let mut tbuf = tag.as_ref().to_vec();
                    let ns = bench(|| { black_box(key.open_in_place(nonce(), Aad::from(black_box(&data[..])), &mut tbuf).unwrap().len()); });
                    report($label, name, "tag_open", sz, ns);
                    // (b) encrypt+tag: AAD=64B header, plaintext=data
                    let mut buf = data.clone();
                    let ns = bench(|| { black_box(key.seal_in_place_separate_tag(nonce(), Aad::from(&HDR), black_box(&mut buf[..])).unwrap()); });
                    report($label, name, "enc_seal", sz, ns);
                    let mut ct = data.clone();
                    let tag = key.seal_in_place_separate_tag(nonce(), Aad::from(&HDR), &mut ct).unwrap();
                    ct.extend_from_slice(tag.as_ref());
                    let mut buf = ct.clone();
                    let ns = bench(|| { buf.copy_from_slice(&ct); black_box(key.open_in_place(nonce(), Aad::from(&HDR), black_box(&mut buf[..])).unwrap().len()); });
                    report($label, name, "enc_open+cpy", sz, ns);
                }
            }
            struct L(usize);
            impl hkdf::KeyType for L { fn len(&self) -> usize { self.0 } }
            pub fn run() {
                run_alg(&AES_128_GCM, "aes128", 16);
                run_alg(&CHACHA20_POLY1305, "chacha", 32);
                let salt = [1u8; 32]; let ikm = [2u8; 32]; let info = [3u8; 16];
                let mut out = [0u8; 16];
                let ns = bench(|| {
                    let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, black_box(&salt)).extract(black_box(&ikm));
                    let infos = [&info[..]];
                    prk.expand(&infos, L(16)).unwrap().fill(&mut out).unwrap();
                    black_box(&out);
                });
                report($label, "hkdf", "extract+exp16", 0, ns);
                println!("# {} hkdf out {:02x?}", $label, &out[..4]);
            }
        }
    };
}

#[cfg(feature = "ring")]
ring_like!(ring_b, ring, "ring");
#[cfg(feature = "aws-lc-rs")]
ring_like!(awslc_b, aws_lc_rs, "aws-lc");

macro_rules! rc_aead {
    ($fname:ident, $cr:ident, $ty:ident, $name:expr, $klen:expr) => {
        fn $fname() {
            use $cr::aead::{AeadInPlace, KeyInit};
            use $cr::$ty as C;
            let kb = [0x11u8; $klen];
            let ns = bench(|| { black_box(C::new(black_box(&kb).into())); });
            report("rustcryp", $name, "key_setup", 0, ns);
            let c = C::new(&kb.into());
            let nonce = [7u8; 12];
            for &sz in SIZES.iter() {
                let data = vec![0xabu8; sz];
                let mut empty: [u8; 0] = [];
                let ns = bench(|| { black_box(c.encrypt_in_place_detached(&black_box(nonce).into(), black_box(&data[..]), &mut empty).unwrap()); });
                report("rustcryp", $name, "tag_seal", sz, ns);
                let tag = c.encrypt_in_place_detached(&black_box(nonce).into(), &data[..], &mut empty).unwrap();
                let ns = bench(|| { black_box(c.decrypt_in_place_detached(&black_box(nonce).into(), black_box(&data[..]), &mut empty, &tag).unwrap()); });
                report("rustcryp", $name, "tag_open", sz, ns);
                let mut buf = data.clone();
                let ns = bench(|| { black_box(c.encrypt_in_place_detached(&black_box(nonce).into(), &HDR, black_box(&mut buf[..])).unwrap()); });
                report("rustcryp", $name, "enc_seal", sz, ns);
                let mut ct = data.clone();
                let tag = c.encrypt_in_place_detached(&black_box(nonce).into(), &HDR, &mut ct).unwrap();
                let mut buf = ct.clone();
                let ns = bench(|| { buf.copy_from_slice(&ct); black_box(c.decrypt_in_place_detached(&black_box(nonce).into(), &HDR, black_box(&mut buf[..]), &tag).unwrap()); });
                report("rustcryp", $name, "enc_open+cpy", sz, ns);
                assert_eq!(buf, data);
            }
        }
    };
}
#[cfg(feature = "aes-gcm")]
rc_aead!(rc_aes, aes_gcm, Aes128Gcm, "aes128", 16);
#[cfg(feature = "chacha20poly1305")]
rc_aead!(rc_chacha, chacha20poly1305, ChaCha20Poly1305, "chacha", 32);

fn main() {
    // memcpy baseline for the *_open+cpy rows
    for &sz in SIZES.iter() {
        let src = vec![1u8; sz + 16]; let mut dst = vec![0u8; sz + 16];
        let ns = bench(|| { dst.copy_from_slice(black_box(&src)); black_box(&dst); });
        report("memcpy", "-", "copy(n+16)", sz, ns);
    }
    #[cfg(feature = "ring")]
    ring_b::run();
    #[cfg(feature = "aws-lc-rs")]
    awslc_b::run();
    #[cfg(feature = "aes-gcm")]
    rc_aes();
    #[cfg(feature = "chacha20poly1305")]
    rc_chacha();
    #[cfg(feature = "hkdf")]
    {
        use hkdf::Hkdf; use sha2::Sha256;
        let salt = [1u8; 32]; let ikm = [2u8; 32]; let info = [3u8; 16];
        let mut out = [0u8; 16];
        let ns = bench(|| {
            let h = Hkdf::<Sha256>::new(Some(black_box(&salt)), black_box(&ikm));
            h.expand(&info, &mut out).unwrap();
            black_box(&out);
        });
        report("rustcryp", "hkdf", "extract+exp16", 0, ns);
        println!("# rustcrypto hkdf out {:02x?}", &out[..4]);
    }
}
