use std::path::Path;

use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};

use super::*;

/// A CA and a leaf it signed, all as PEM: (ca cert, leaf cert, leaf key, another key).
fn pems() -> (String, String, String, String) {
    let ca_key = KeyPair::generate().unwrap();
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = p.self_signed(&ca_key).unwrap();
    let leaf_key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["localhost".into()])
        .unwrap()
        .signed_by(&leaf_key, &ca, &ca_key)
        .unwrap();
    let other = KeyPair::generate().unwrap();
    (
        ca.pem(),
        leaf.pem(),
        leaf_key.serialize_pem(),
        other.serialize_pem(),
    )
}

fn f<'a>(bytes: &'a str, flag: &'a str) -> PemFile<'a> {
    PemFile {
        bytes: bytes.as_bytes(),
        path: Path::new("x.pem"),
        flag,
    }
}

#[test]
fn a_certificate_and_its_own_key_pass() {
    let (ca, leaf, key, _) = pems();
    check_ca(&f(&ca, "--rdzv-tls-ca")).unwrap();
    check_identity(&f(&leaf, "--tls-cert"), &f(&key, "--tls-key")).unwrap();
    // A chain file (leaf then CA) is a chain.
    let chain = format!("{leaf}{ca}");
    assert_eq!(certificates(&f(&chain, "--tls-cert")).unwrap().len(), 2);
}

#[test]
fn a_key_of_another_certificate_is_named_with_both_flags() {
    let (_, leaf, _, other) = pems();
    let e = check_identity(&f(&leaf, "--tls-cert"), &f(&other, "--tls-key"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("does not belong to the certificate")
            && e.contains("(--tls-key)")
            && e.contains("(--tls-cert)"),
        "{e}"
    );
}

#[test]
fn empty_garbage_or_swapped_files_are_named_with_their_flag() {
    let (ca, leaf, key, _) = pems();
    for bad in ["", "not a pem", key.as_str()] {
        let e = check_ca(&f(bad, "--rdzv-tls-ca")).unwrap_err().to_string();
        assert!(
            e.contains("holds no PEM certificate") && e.contains("(--rdzv-tls-ca)"),
            "{e}"
        );
    }
    // A key where the certificate goes, and a certificate where the key goes.
    let e = check_identity(&f(&key, "--tls-cert"), &f(&key, "--tls-key"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("(--tls-cert)") && e.contains("no PEM certificate"),
        "{e}"
    );
    let e = check_identity(&f(&leaf, "--tls-cert"), &f(&ca, "--tls-key"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("(--tls-key)") && e.contains("no readable PEM private key"),
        "{e}"
    );
    // A CERTIFICATE block whose body is not a certificate.
    let junk = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
    let e = check_ca(&f(junk, "--rdzv-tls-ca")).unwrap_err().to_string();
    assert!(e.contains("(--rdzv-tls-ca)"), "{e}");
}

/// What `openssl x509 -req -signkey` writes without an extensions file: an X.509 v1
/// certificate (P-256, CN=localhost, valid until 2126), and its key. Test material only.
const V1_CERT: &str = "-----BEGIN CERTIFICATE-----
MIIBJTCBywIUMsOK2NMVL269Y5YrqzhmdA4EiHQwCgYIKoZIzj0EAwIwFDESMBAG
A1UEAwwJbG9jYWxob3N0MCAXDTI2MTIwMzEzMzk0MVoYDzIxMjYxMTA5MTMzOTQx
WjAUMRIwEAYDVQQDDAlsb2NhbGhvc3QwWTATBgcqhkjOPQIBBggqhkjOPQMBBwNC
AARSJYwCHqgCm5Hj9/hzx3+HXf/G9Y1CyIEVLGTRrJQmi/W7KIqTOnSwY5rX8paJ
THj7q6Sgf4TSkeALyacIy3XeMAoGCCqGSM49BAMCA0kAMEYCIQCzEwrmjfmnw7/I
WWMoJwR+WK7Y7mCb5YIoRPD79bPg+AIhAOIbFs1fpAIBI2mAYoRbbY5DA2lHkN5p
M/lWLwq5T3N1
-----END CERTIFICATE-----
";
const V1_KEY: &str = "-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQg7HPftBK0AOdceM3y
y8vK9AXxdNS03N7p3sVtjKZmOsmhRANCAARSJYwCHqgCm5Hj9/hzx3+HXf/G9Y1C
yIEVLGTRrJQmi/W7KIqTOnSwY5rX8paJTHj7q6Sgf4TSkeALyacIy3Xe
-----END PRIVATE KEY-----
";

#[test]
fn an_x509_v1_certificate_is_named_with_the_fix() {
    for flag in ["--tls-cert", "--rdzv-tls-cert", "--rdzv-host-tls-cert"] {
        let e = check_identity(&f(V1_CERT, flag), &f(V1_KEY, "--tls-key"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&format!("({flag}) is an X.509 v1 certificate"))
                && e.contains("reissue it as v3")
                && !e.contains("OtherError"),
            "{e}"
        );
    }
}
